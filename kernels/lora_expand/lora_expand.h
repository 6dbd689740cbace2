// vLLM add_expand / lora_expand: for tokens with a slot l and each slice s,
//   y[t, c_s + n] = (add_inputs ? y[t, c_s + n] : 0) + round_w(B_s[l] @ round_w(x[s, t, :]))[n]
// with c_s = offset_start + sum_{j<s} N_s. Tokens with slot -1 and columns outside the slices are
// never touched. Only the first lora_ranks[l] columns of B_s[l] / entries of x are read.
#pragma once
#include <cstdint>
#include <string>
#include <cuda_runtime_api.h>
#include "kernels/common/dtype.h"
#include "kernels/common/lora_types.h"

namespace punica::kernels {

struct LoraExpandArgs {
  DType in_dtype = DType::f32;    // x: fp32 (shrink buffer) or the weight dtype
  DType dtype = DType::bf16;      // B and y
  int64_t num_tokens = 0;         // T
  const void* x = nullptr;        // [S, T, max_rank] contiguous
  int num_slices = 1;
  const void* lora_b[kMaxSlices] = {};   // each [L, N_s, max_rank] contiguous (vLLM [L,1,N_s,r])
  int64_t slice_width[kMaxSlices] = {};  // N_s (taken from B, may differ per slice)
  int max_loras = 0;
  int max_rank = 0;
  int num_active_loras = 0;       // 0 = unknown; else an upper bound on the distinct adapters the
                                  // batch uses (planned_loras, kernels/common/lora_types.h)
  const int32_t* lora_ranks = nullptr;   // [L]
  LoraMetaView meta;
  void* y = nullptr;              // [T, >= offset_start + sum N_s], row stride y_row_stride
  int64_t y_row_stride = 0;
  int64_t offset_start = 0;
  bool add_inputs = true;
};

// Some of its kernels are programmatic dependents of the kernel before them on `stream`: the
// metadata and lora_ranks (and lora_b) must not be written by that kernel (kernels/README.md, "Programmatic
// dependent launch"); x and y may be.
void launch_lora_expand(const LoraExpandArgs& args, cudaStream_t stream);

// A fixed prefill (mma) kernel instead of the automatic choice (tests, and `punica-bench --kernel
// expand=KIND`). automatic = launch_lora_expand. mma_pipe: the pipelined kernel (max_rank <= 64, <= 128 with an fp32 x);
// mma_stream: the streaming kernel (any rank); mma_staged: the staged kernel (every layout). Where a
// kernel's preconditions fail the next more general one runs. An explicit kernel runs at any T (the
// automatic choice takes the decode kernels for small batches) in its general configuration (the
// automatic choice also picks small-batch tile heights).
enum class ExpandPrefillKernel { automatic, mma_staged, mma_stream, mma_pipe };
// Every kind, automatic first (the order `--kernel` lists them in).
inline constexpr ExpandPrefillKernel kExpandKernels[] = {ExpandPrefillKernel::automatic, ExpandPrefillKernel::mma_staged,
                                                         ExpandPrefillKernel::mma_stream, ExpandPrefillKernel::mma_pipe};
// The kind's name as `--kernel expand=NAME` takes it: auto, staged, stream, pipe.
inline const char* kind_name(ExpandPrefillKernel k) {
  switch (k) {
    case ExpandPrefillKernel::automatic: return "auto";
    case ExpandPrefillKernel::mma_staged: return "staged";
    case ExpandPrefillKernel::mma_stream: return "stream";
    case ExpandPrefillKernel::mma_pipe: return "pipe";
  }
  return "?";
}
void launch_lora_expand_with(const LoraExpandArgs& a, ExpandPrefillKernel which, cudaStream_t stream);

// The plan launch_lora_expand_with(a, which) runs (kernels/lora_expand/heuristics.h: the kernel and
// its tile), from a's sizes, dtypes and pointer alignment and the current device's SM count (cached
// per device; 132 without a GPU). No device memory is read.
struct ExpandPlan;
ExpandPlan lora_expand_plan(const LoraExpandArgs& a, ExpandPrefillKernel which = ExpandPrefillKernel::automatic);
// A short stable name of a plan, e.g. "pipe/bm64/bn64/bk64", "stream/bm16", "decode".
std::string plan_name(const ExpandPlan& p);
// plan_name(lora_expand_plan(a, which)).
std::string describe_lora_expand_plan(const LoraExpandArgs& a,
                                      ExpandPrefillKernel which = ExpandPrefillKernel::automatic);

}  // namespace punica::kernels
