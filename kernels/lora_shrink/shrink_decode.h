// Decode-path kernel of vLLM lora_shrink (add_shrink) and its host launch: one kernel, no memset,
// no atomics; every element of y [S, T, max_rank] is written (zeros for -1 tokens and past the
// true rank), so the result is deterministic.
#pragma once
#include <cuda_runtime_api.h>
#include "kernels/lora_shrink/lora_shrink.h"

namespace punica::kernels::detail {

// Launched as a programmatic dependent of whatever precedes it on the stream. Before it waits
// (griddepcontrol.wait) it reads only the LoRA metadata and lora_ranks; x, A and y come after the wait.
// Precondition: the metadata and ranks are not written by the kernel directly before this one on
// the stream, because a programmatic dependent may start before that kernel's writes are visible
// (and add_lora_linear's expand, which starts during this kernel, may not see them either). Inputs
// written by copies, or by a kernel with an ordinary launch between it and this one, are safe;
// punica-bench synchronizes after computing the metadata (lora_meta).
void launch_shrink_decode(const LoraShrinkArgs& a, cudaStream_t stream);
// The same with the block shape given: per_token = one token per block (shrink_heur::decode_per_token
// chooses for the overload above).
void launch_shrink_decode(const LoraShrinkArgs& a, bool per_token, cudaStream_t stream);

}  // namespace punica::kernels::detail
