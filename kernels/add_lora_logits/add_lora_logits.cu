// LogitsProcessorWithLoRA's add_lora_logits on request-level (sampler) routing, in two kernels:
// (1) u[j][0:r_s] = round_w(scale * A[s_j] @ x[j]) into the caller's fp32 workspace (row_dot.cuh),
// (2) a wide-N expand over the vocabulary, rows sorted by slot so each B row is read once per run:
// y[j, 0:V] += round_w(B[s_j] @ u[j]) (sorted_expand.cuh). Rows with slot -1 are never touched.
#include "kernels/add_lora_logits/add_lora_logits.h"
#include "kernels/add_lora_embedding/sorted_expand.cuh"
#include "kernels/add_lora_logits/row_dot.cuh"
#include "kernels/common/error.h"
#include "kernels/lora_expand/lora_expand_internal.h"

#include <algorithm>

namespace punica::kernels {
namespace {

template <class T>
struct LogitsShrinkEpi {
  float* u;  // [R, max_rank]
  const int32_t* ranks;
  int max_rank;
  float scale;
  __device__ __forceinline__ int outputs(int slot) const { return ranks ? ranks[slot] : max_rank; }
  __device__ __forceinline__ void store(int64_t row, int slot, int k, float acc) const {
    u[row * max_rank + k] = elem::round_w<T>(scale * acc);
  }
};

}  // namespace

std::size_t add_lora_logits_workspace_bytes(int64_t max_rows, int max_rank) {
  const std::size_t n = std::size_t(max_rows > 0 ? max_rows : 0) * std::size_t(max_rank > 0 ? max_rank : 0);
  return std::max<std::size_t>(256, (n * sizeof(float) + 255) / 256 * 256);
}

void launch_add_lora_logits(const AddLoraLogitsArgs& a, cudaStream_t stream) {
  PUNICA_REQUIRE(a.num_rows >= 0 && a.hidden >= 0 && a.vocab_size >= 0 && a.max_rank >= 0 &&
                     a.max_loras >= 0,
                 ErrorKind::usage, "add_lora_logits: negative size");
  if (a.num_rows == 0 || a.vocab_size == 0 || a.max_rank == 0 || a.max_loras == 0) return;
  PUNICA_REQUIRE(a.max_rank <= 512, ErrorKind::usage, "add_lora_logits: max_rank above 512");
  PUNICA_REQUIRE(a.x && a.lora_a && a.lora_b && a.y && a.workspace && a.meta.token_lora_mapping &&
                     a.meta.sorted_token_ids,
                 ErrorKind::usage, "add_lora_logits: null pointer");
  PUNICA_REQUIRE(a.x_row_stride >= a.hidden && a.y_row_stride >= a.vocab_size, ErrorKind::usage,
                 "add_lora_logits: row stride smaller than the row");
  float* u = static_cast<float*>(a.workspace);
  elem::dispatch_dtype(a.dtype, [&](auto tag) {
    using T = decltype(tag);
    row_dot::launch<T>(a.num_rows, a.max_rank, a.hidden, static_cast<const T*>(a.x), a.x_row_stride,
                       static_cast<const T*>(a.lora_a), int64_t(a.max_rank) * a.hidden,
                       a.meta.token_lora_mapping,
                       LogitsShrinkEpi<T>{u, a.lora_ranks, a.max_rank, a.scale}, stream);
    // Many rows (> 128) with 16-bit rows and max_rank <= 64: the pipelined tensor-core expand
    // over u (fp32, already rounded; only the true rank of each row was written and is read).
    // The CUDA-core sorted expand below reached 0.17 of the floor at 256 rows of Llama-3-8B's
    // lm_head (git 2c77476); it stays for fewer rows, where each B row is read once per run of
    // equal slots and the tiles of 64 rows would be mostly empty.
    if (detail::launch_expand_pipe(detail::one_slice_expand(DType::f32, a.dtype, a.num_rows, u, a.lora_b,
                                                            a.vocab_size, a.max_loras, a.max_rank, a.lora_ranks,
                                                            a.meta, a.y, a.y_row_stride, true),
                                   nullptr, 0, stream))
      return;
    const sorted_expand::Params p{a.num_rows, a.meta.sorted_token_ids, a.meta.token_lora_mapping,
                                  a.lora_ranks, a.max_rank, a.vocab_size, a.y, a.y_row_stride,
                                  /*add_inputs=*/true};
    sorted_expand::launch<T>(p, static_cast<const T*>(a.lora_b), sorted_expand::BufferRows{u}, stream);
  });
}

std::string describe_add_lora_logits_plan(const AddLoraLogitsArgs& a) {
  if (a.num_rows <= 0 || a.vocab_size <= 0 || a.max_rank <= 0 || a.max_loras <= 0) return "none";
  const int sms = current_sm_count();
  std::string s = "row_dot/opb" + std::to_string(pick_row_dot_opb(a.num_rows, a.max_rank, sms));
  if (detail::expand_pipe_ok(detail::one_slice_expand(DType::f32, a.dtype, a.num_rows, a.workspace, a.lora_b,
                                                      a.vocab_size, a.max_loras, a.max_rank, a.lora_ranks, a.meta,
                                                      a.y, a.y_row_stride, true),
                             nullptr))
    return s + (a.max_rank <= 16 ? "+pipe/bm64/bk16" : "+pipe/bm64/bk64");
  const SortedExpandConfig c = pick_sorted_expand_config(a.num_rows, a.vocab_size, sms);
  return s + "+sorted_expand/tm" + std::to_string(c.tm) + "/th" + std::to_string(c.threads);
}

}  // namespace punica::kernels
