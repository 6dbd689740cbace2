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
// y come after the wait. Precondition: the metadata, ranks and B are not written by the kernel
// directly before this one on the stream (in add_lora_linear: before its shrink), because a
// programmatic dependent may start before that kernel's writes are visible. Inputs written by copies,
// or by a kernel with an ordinary launch between it and this one, are safe; punica-bench
// synchronizes after computing the metadata (lora_meta).
void launch_expand_decode(const LoraExpandArgs& a, cudaStream_t stream);

}  // namespace punica::kernels::detail
