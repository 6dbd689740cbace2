// Explicit path choice of add_lora_linear, for tests and timing (launch_add_lora_linear picks
// one by linear_heur).
#pragma once
#include <cuda_runtime_api.h>
#include "kernels/add_lora_linear/add_lora_linear.h"

namespace punica::kernels::detail {

// decode: the decode shrink -> (PDL) the decode expand; partials: the split-K GEMV partials ->
// (PDL) the wide-N expand; tiles: the automatic shrink -> the mma expand (pipelined where it
// applies) at any T. decode and partials exist for T <= 128 only (the workspace holds the
// partials of at most 128 tokens); beyond, they run the automatic path.
enum class LinearPath { automatic, decode, partials, tiles };
void launch_add_lora_linear_with(const AddLoraLinearArgs& a, LinearPath path, cudaStream_t stream);

}  // namespace punica::kernels::detail
