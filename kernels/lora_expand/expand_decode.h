// Decode-path kernel of vLLM lora_expand (add_expand) and its host launch: one kernel, no memset,
// y[t, c_s + n] (+)= round_w(B_s[l] @ round_w(x[s, t, :r_l]))[n]. Used for every shape the mma
// prefill kernels do not take (T <= 128, fp32 weights, unaligned B), and by add_lora_linear's
// decode path behind its shrink (programmatic dependent launch).
#pragma once
#include <cuda_runtime_api.h>
#include "kernels/lora_expand/lora_expand.h"

namespace punica::kernels::detail {

// Launched as a programmatic dependent of whatever precedes it on the stream. Before it waits
// (griddepcontrol.wait) it reads only the LoRA metadata, lora_ranks and B (its adapters' rows); x and
// y come after the wait. Precondition: the metadata, ranks and B are not written by a kernel that
// triggers its dependents early (griddepcontrol.launch_dependents). None of punica-bench's kernels
// writes them; inputs written by copies or by ordinary kernels (which trigger at their end) are safe.
void launch_expand_decode(const LoraExpandArgs& a, cudaStream_t stream);

}  // namespace punica::kernels::detail
