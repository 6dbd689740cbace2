// Decode-path kernel of vLLM lora_shrink (add_shrink) and its host launch: one kernel, no memset,
// no atomics; every element of y [S, T, max_rank] is written (zeros for -1 tokens and past the
// true rank), so the result is deterministic.
#pragma once
#include <cuda_runtime_api.h>
#include "kernels/lora_shrink/lora_shrink.h"

namespace punica::kernels::detail {

// Launched as a programmatic dependent of whatever precedes it on the stream. Before it waits
// (griddepcontrol.wait) it reads only the LoRA metadata and lora_ranks; x, A and y come after the wait.
// Precondition: the metadata and ranks are not written by a kernel that triggers its dependents early
// (griddepcontrol.launch_dependents). None of punica-bench's kernels writes them; inputs written by
// copies or by ordinary kernels (which trigger at their end) are safe.
void launch_shrink_decode(const LoraShrinkArgs& a, cudaStream_t stream);

}  // namespace punica::kernels::detail
