// Internal entry points of lora_shrink used by add_lora_linear's fused decode path: the split-K
// GEMV that writes per-split fp32 partials (scaled) instead of atomically adding into y.
#pragma once
#include <cstdint>
#include <cuda_runtime_api.h>
#include "kernels/lora_shrink/lora_shrink.h"

namespace punica::kernels::detail {

// partials: [nsplit, S, T, max_rank] fp32; only rows j < lora_ranks[slot] of tokens with a slot
// are written. Returns nsplit (a function of K alone, see shrink_heur::gemv_config).
int launch_shrink_partials(const LoraShrinkArgs& a, float* partials, cudaStream_t stream);
int shrink_partials_nsplit(int64_t K);

// Kernel choice for tests and benchmarks. automatic = launch_lora_shrink. legacy: memset of y, then
// the per-slice mma tiles (prefill) or the atomic split-K GEMV (decode) as before the fused kernel.
// fused / fused_nosplit: the fused prefill kernel (16-bit x, fp32 y, aligned rows) for any T, with
// the automatic split-K choice / with split-K off (every y element written by the kernel);
// other shapes fall back to the automatic path.
// fused128 (experimental, not chosen automatically): the fused kernel with 128-token tiles for
// adapters of at most 6 groups of 16 columns (otherwise the 64-token fused kernel).
// fused_sk / fused128_sk: the same kernels as stream-K over one wave of resident blocks.
// fused_wk: the fused kernel with automatic's split-K / stream-K choice and the warp-k tile
// wherever the adapters have at most 4 groups of 16 columns (automatic takes it only where
// shrink_heur::auto_wk says), else the 2 x 4 tile.
// fused_wg: the wgmma tile (128 tokens, both operands in shared memory; sm_90a) where
// 16 * S * ceil(R/16) is 32, 48, 64 or 192 and wgmma_available(), else fused (automatic takes it
// where shrink_heur::auto_wg says, and outside add_lora_linear where shrink_heur::auto_wg_band says).
// cluster: the cluster split-K tile (shrink_cluster.cu; 16-bit x, fp32 y, 16-byte rows,
// shrink_heur::cluster_fits, an sm_90 device) at any T, else automatic (automatic takes it where
// shrink_heur::auto_cluster says). no_cluster: automatic's choice without the cluster tile.
// small_cluster: automatic's choice with the cluster tile only where shrink_heur::auto_cluster_small
// says, and without auto_wg_band's wgmma tile (add_lora_linear's shrink: both rules lost or did not
// gain inside its chain, heuristics.h).
enum class ShrinkKernel {
  automatic, legacy, fused, fused_nosplit, fused128, fused_sk, fused128_sk, fused_wk, fused_wg, cluster, no_cluster,
  small_cluster
};
void launch_lora_shrink_with(const LoraShrinkArgs& a, ShrinkKernel k, cudaStream_t stream);
// The wgmma tile can run: the build holds sm_90a code (PUNICA_HAVE_SM90A) and the device is 9.0.
bool wgmma_available();
// The current device's SM count (cached per device; 132 where it cannot be read).
int num_sms_cached();
// Thread-block clusters can be launched on the current device (sm_90 and later).
bool cluster_available();
// The cluster tile takes this call (dtypes, alignment, ranks, device); launch_shrink_cluster requires it.
bool shrink_cluster_ok(const LoraShrinkArgs& a);
// Launched as a programmatic dependent of the kernel before it on the stream (griddepcontrol.wait
// before x is read). late_trigger: its own dependents may launch only once every CTA has passed that
// wait, i.e. once the kernel before it has finished, so that a dependent may read what that kernel
// wrote before its own wait (add_lora_linear's expand, which loads y early); without it such a
// dependent could see y before the kernel before the shrink wrote it.
void launch_shrink_cluster(const LoraShrinkArgs& a, cudaStream_t stream, bool late_trigger = false);

}  // namespace punica::kernels::detail
