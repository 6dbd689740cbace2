// Decode-path kernel of vLLM lora_shrink (add_shrink) and its host launch: one kernel, no memset,
// no atomics; every element of y [S, T, max_rank] is written (zeros for -1 tokens and past the
// true rank), so the result is deterministic.
#pragma once
#include <cuda_runtime_api.h>
#include "kernels/lora_shrink/lora_shrink.h"

namespace punica::kernels::detail {

// Launched as a programmatic dependent of whatever precedes it on the stream: the kernel waits
// (griddepcontrol.wait) before its first global access, so it is safe after any producer.
void launch_shrink_decode(const LoraShrinkArgs& a, cudaStream_t stream);

}  // namespace punica::kernels::detail
