// Host launchers of the lora_shrink kernel families, one per file (shrink_legacy.cu, shrink_fused.cu;
// the decode and cluster kernels: shrink_decode.h, lora_shrink_internal.h). lora_shrink.cu executes
// the plan (heuristics.h, lora_shrink_plan) through them; each runs exactly the configuration given.
#pragma once
#include <cstdint>
#include <cuda_runtime_api.h>
#include "kernels/common/dtype.h"
#include "kernels/lora_shrink/heuristics.h"
#include "kernels/lora_shrink/shrink_params.h"

namespace punica::kernels::detail {

// shrink_legacy.cu. The GEMV into y [S, T, R]: fp32 atomics where out is f32 (y zeroed first; pdl:
// a programmatic dependent of the zero kernel, waiting only before its atomics), else stores.
void launch_shrink_gemv(const ShrinkParams& p, DType dtype, DType out, bool vec, const shrink_heur::GemvConfig& c,
                        bool pdl, cudaStream_t st);
// The GEMV's per-split partials [nsplit, S, T, R] (p.y) for add_lora_linear's decode path.
void launch_shrink_gemv_partials(const ShrinkParams& p, DType dtype, bool vec, const shrink_heur::GemvConfig& c,
                                 cudaStream_t st);
// The per-slice mma tiles (16-bit x, fp32 y zeroed first; atomics where c.ksplit > 1).
void launch_shrink_mma(const ShrinkParams& p, DType dtype, bool vec, const shrink_heur::MmaConfig& c, cudaStream_t st);

// shrink_fused.cu. The fused kernel (16-bit x, fp32 y, 16-byte rows) in configuration c; where
// c.ksplit > 1 or c.stream_k, y must be zeroed first by launch_shrink_zero (its PDL primary).
void launch_shrink_fused(const ShrinkParams& p, DType dtype, const shrink_heur::FusedConfig& c, cudaStream_t st);
// Zeroes n floats of y; triggers its programmatic dependents at once.
void launch_shrink_zero(float* y, int64_t n, cudaStream_t st);

}  // namespace punica::kernels::detail
