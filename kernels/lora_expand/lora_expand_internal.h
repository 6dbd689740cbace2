// Internal entry points of lora_expand: the one used by add_lora_linear's fused decode path (the
// wide-N GEMV whose input is the sum of shrink's split-K partials ([nsplit, S, T, max_rank] fp32),
// read after a programmatic-dependent-launch wait so that its start overlaps the shrink kernel),
// and a launch with an explicit prefill kernel choice (tests, timing).
#pragma once
#include <cuda_runtime_api.h>
#include "kernels/lora_expand/lora_expand.h"

namespace punica::kernels::detail {

// Prefill (mma) kernel selection for tests and timing: automatic = what heuristics.h picks.
// mma_staged3: the staged kernel compiled for 3 blocks per SM (register cap 80), for comparison.
// mma_persistent (128 x 128 tiles) / mma_persistent_wide (64 x 256): the persistent pipelined kernel;
// where its preconditions fail (unaligned y, max_rank > 128) these run the staged kernel instead.
enum class ExpandPrefillKernel {
  automatic, mma_fragment, mma_staged, mma_staged3, mma_persistent, mma_persistent_wide
};
void launch_lora_expand_with(const LoraExpandArgs& a, ExpandPrefillKernel which, cudaStream_t stream);

// Whether the persistent prefill kernel's preconditions hold for these arguments (tests).
bool expand_persistent_applicable(const LoraExpandArgs& a);

void launch_expand_from_partials(const LoraExpandArgs& a, const float* partials, int nsplit,
                                 cudaStream_t stream);

}  // namespace punica::kernels::detail
