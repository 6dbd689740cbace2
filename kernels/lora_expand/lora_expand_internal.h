// Internal entry points of lora_expand: the one used by add_lora_linear's fused decode path (the
// wide-N GEMV whose input is the sum of shrink's split-K partials ([nsplit, S, T, max_rank] fp32),
// read after a programmatic-dependent-launch wait so that its start overlaps the shrink kernel),
// and a launch with an explicit prefill kernel choice (tests, timing).
#pragma once
#include <cuda_runtime_api.h>
#include "kernels/lora_expand/lora_expand.h"

namespace punica::kernels::detail {

// Prefill (mma) kernel selection for tests and timing: automatic = what heuristics.h picks.
// mma_pipe: the pipelined kernel (max_rank <= 64); mma_stream: the streaming kernel (any rank);
// mma_staged: the staged kernel (every layout). Where a kernel's preconditions fail the next more
// general one runs; expand_prefill_kernel says which one a call would run.
enum class ExpandPrefillKernel { automatic, mma_staged, mma_stream, mma_pipe };
void launch_lora_expand_with(const LoraExpandArgs& a, ExpandPrefillKernel which, cudaStream_t stream);

// The prefill kernel that launch_lora_expand_with(a, which) runs (automatic = not a prefill kernel).
ExpandPrefillKernel expand_prefill_kernel(const LoraExpandArgs& a, ExpandPrefillKernel which);

void launch_expand_from_partials(const LoraExpandArgs& a, const float* partials, int nsplit,
                                 cudaStream_t stream);

}  // namespace punica::kernels::detail
