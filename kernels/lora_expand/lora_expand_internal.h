// Internal entry points of lora_expand: the one used by add_lora_linear's fused decode path (the
// wide-N GEMV whose input is the sum of shrink's split-K partials ([nsplit, S, T, max_rank] fp32),
// read after a programmatic-dependent-launch wait so that its start overlaps the shrink kernel),
// and the prefill kernel a call runs (tests).
#pragma once
#include <cuda_runtime_api.h>
#include "kernels/lora_expand/heuristics.h"
#include "kernels/lora_expand/lora_expand.h"

namespace punica::kernels::detail {

// The automatic expand right after a lora_shrink in the same stream (add_lora_linear prefill): the
// pipelined kernel is launched as a programmatic dependent of the shrink (its y and B loads overlap
// the shrink's tail; it waits for the shrink before reading x). Every kernel before the shrink must
// be complete when the shrink starts (true: the shrink's first kernel is an ordinary launch).
void launch_lora_expand_after_shrink(const LoraExpandArgs& a, cudaStream_t stream);

// The prefill kernel that launch_lora_expand_with(a, which) runs (automatic = not a prefill kernel);
// after_shrink: the one launch_lora_expand_after_shrink(a) runs.
ExpandPrefillKernel expand_prefill_kernel(const LoraExpandArgs& a, ExpandPrefillKernel which,
                                          bool after_shrink = false);
// The plan launch_lora_expand_with(a, which) (after_shrink: launch_lora_expand_after_shrink(a)) runs.
ExpandPlan plan_expand(const LoraExpandArgs& a, ExpandPrefillKernel which, bool after_shrink);

// The pipelined prefill kernel alone (add_lora_embedding, add_lora_logits): runs only where its
// preconditions hold (one slice, 16-bit B / y, max_rank <= 64 and % 8, prefill-sized T, 16-byte
// rows, lora_ranks and the whole adapter-level metadata given) and returns false without launching
// anything otherwise. With x_ids, token t's x row is
// the A-table row x[l][x_ids[t]] ([L, x_vocab, max_rank], the dtype of B; ids outside
// [0, x_vocab) read as zeros) instead of x[t].
bool launch_expand_pipe(const LoraExpandArgs& a, const int32_t* x_ids, int64_t x_vocab, cudaStream_t stream);
// Whether launch_expand_pipe(a, x_ids, ...) would launch (host only, no CUDA call).
bool expand_pipe_ok(const LoraExpandArgs& a, const int32_t* x_ids);

// One-slice expand arguments (offset 0) for the callers of launch_expand_pipe.
inline LoraExpandArgs one_slice_expand(DType in_dtype, DType dtype, int64_t num_tokens, const void* x,
                                       const void* b, int64_t n, int max_loras, int max_rank,
                                       const int32_t* ranks, const LoraMetaView& meta, void* y,
                                       int64_t y_row_stride, bool add_inputs) {
  LoraExpandArgs e;
  e.in_dtype = in_dtype;
  e.dtype = dtype;
  e.num_tokens = num_tokens;
  e.x = x;
  e.num_slices = 1;
  e.lora_b[0] = b;
  e.slice_width[0] = n;
  e.max_loras = max_loras;
  e.max_rank = max_rank;
  e.lora_ranks = ranks;
  e.meta = meta;
  e.y = y;
  e.y_row_stride = y_row_stride;
  e.add_inputs = add_inputs;
  return e;
}

void launch_expand_from_partials(const LoraExpandArgs& a, const float* partials, int nsplit,
                                 cudaStream_t stream);

}  // namespace punica::kernels::detail
