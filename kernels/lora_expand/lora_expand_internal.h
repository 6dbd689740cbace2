// Internal entry point of lora_expand used by add_lora_linear's fused decode path: the wide-N
// GEMV whose input is the sum of shrink's split-K partials ([nsplit, S, T, max_rank] fp32), read
// after a programmatic-dependent-launch wait so that its start overlaps the shrink kernel.
#pragma once
#include <cuda_runtime_api.h>
#include "kernels/lora_expand/lora_expand.h"

namespace punica::kernels::detail {

void launch_expand_from_partials(const LoraExpandArgs& a, const float* partials, int nsplit,
                                 cudaStream_t stream);

}  // namespace punica::kernels::detail
