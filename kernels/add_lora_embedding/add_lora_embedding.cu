// VocabParallelEmbeddingWithLoRA's LoRA delta in one kernel: the A-row lookup (A stored
// transposed, row = token id) is fused into the expand, so the rank-r rows never go to memory:
// y[t] (+)= round_w(B[slot] @ A[slot][token_id[t]][0:r_slot]) over tokens sorted by slot.
#include "kernels/add_lora_embedding/add_lora_embedding.h"
#include "kernels/add_lora_embedding/sorted_expand.cuh"
#include "kernels/common/error.h"
#include "kernels/lora_expand/lora_expand_internal.h"

namespace punica::kernels {

void launch_add_lora_embedding(const AddLoraEmbeddingArgs& a, cudaStream_t stream) {
  PUNICA_REQUIRE(a.num_tokens >= 0 && a.embed_dim >= 0 && a.vocab_size >= 0 && a.max_rank >= 0 &&
                     a.max_loras >= 0,
                 ErrorKind::usage, "add_lora_embedding: negative size");
  if (a.num_tokens == 0 || a.embed_dim == 0 || a.max_rank == 0 || a.max_loras == 0) return;
  PUNICA_REQUIRE(a.max_rank <= 512, ErrorKind::usage, "add_lora_embedding: max_rank above 512");
  PUNICA_REQUIRE(a.token_ids && a.lora_a && a.lora_b && a.y && a.meta.token_lora_mapping &&
                     a.meta.sorted_token_ids,
                 ErrorKind::usage, "add_lora_embedding: null pointer");
  PUNICA_REQUIRE(a.y_row_stride >= a.embed_dim, ErrorKind::usage,
                 "add_lora_embedding: y_row_stride smaller than embed_dim");
  PUNICA_REQUIRE(a.num_tokens < (int64_t(1) << 31), ErrorKind::usage,
                 "add_lora_embedding: more than 2^31 tokens");
  // Prefill with 16-bit rows and max_rank <= 64: the pipelined tensor-core expand with the A rows
  // gathered per token (the CUDA-core sorted expand below reached 0.14-0.18 of the floor at
  // Llama-3-8B prefill shapes, git 2c77476).
  if (detail::launch_expand_pipe(detail::one_slice_expand(a.dtype, a.dtype, a.num_tokens, a.lora_a, a.lora_b,
                                                          a.embed_dim, a.max_loras, a.max_rank, a.lora_ranks,
                                                          a.meta, a.y, a.y_row_stride, a.add_inputs),
                                 a.token_ids, a.vocab_size, stream))
    return;
  sorted_expand::Params p{a.num_tokens, a.meta.sorted_token_ids, a.meta.token_lora_mapping,
                          a.lora_ranks, a.max_rank, a.embed_dim, a.y, a.y_row_stride,
                          a.add_inputs};
  elem::dispatch_dtype(a.dtype, [&](auto tag) {
    using T = decltype(tag);
    const sorted_expand::GatherRows<T> src{static_cast<const T*>(a.lora_a), a.token_ids,
                                           a.vocab_size};
    sorted_expand::launch<T>(p, static_cast<const T*>(a.lora_b), src, stream);
  });
}

std::string describe_add_lora_embedding_plan(const AddLoraEmbeddingArgs& a) {
  if (a.num_tokens <= 0 || a.embed_dim <= 0 || a.max_rank <= 0 || a.max_loras <= 0) return "none";
  if (detail::expand_pipe_ok(detail::one_slice_expand(a.dtype, a.dtype, a.num_tokens, a.lora_a, a.lora_b, a.embed_dim,
                                                      a.max_loras, a.max_rank, a.lora_ranks, a.meta, a.y,
                                                      a.y_row_stride, a.add_inputs),
                             a.token_ids))
    return a.max_rank <= 16 ? "pipe/bm64/bk16" : "pipe/bm64/bk64";
  const SortedExpandConfig c = pick_sorted_expand_config(a.num_tokens, a.embed_dim, current_sm_count());
  return "sorted_expand/tm" + std::to_string(c.tm) + "/th" + std::to_string(c.threads);
}

}  // namespace punica::kernels
