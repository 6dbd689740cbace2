// vLLM add_shrink / lora_shrink: y[s, t, :] = scale * A_s[slot(t)] @ x[t] for tokens with a slot,
// y[s, t, :] = 0 for tokens with slot -1 (shrink OVERWRITES the whole [S, T, max_rank] buffer).
// Work is proportional to each slot's true rank: columns j >= lora_ranks[slot] are written as 0
// and A's padding rows are never read.
#pragma once
#include <cstdint>
#include <string>
#include <cuda_runtime_api.h>
#include "kernels/common/dtype.h"
#include "kernels/common/lora_types.h"

namespace punica::kernels {

struct LoraShrinkArgs {
  DType dtype = DType::bf16;      // x and A
  DType out_dtype = DType::f32;   // y (fp32 by the chosen semantics; 16-bit allowed)
  int64_t num_tokens = 0;         // T
  int64_t hidden = 0;             // K
  const void* x = nullptr;        // [T, K], row stride x_row_stride elements
  int64_t x_row_stride = 0;
  int num_slices = 1;             // S <= kMaxSlices
  const void* lora_a[kMaxSlices] = {};  // each [L, max_rank, K] contiguous (vLLM [L,1,r,K])
  int max_loras = 0;              // L
  int max_rank = 0;               // r (padded)
  int num_active_loras = 0;       // 0 = unknown; else an upper bound on the distinct adapters the
                                  // batch uses (planned_loras, kernels/common/lora_types.h)
  const int32_t* lora_ranks = nullptr;  // [L] true rank per slot (0 = empty slot)
  LoraMetaView meta;              // token-level metadata
  float scale = 1.0f;
  void* y = nullptr;              // [S, T, max_rank] contiguous
};

// Some of its kernels are programmatic dependents of the kernel before them on `stream`: the
// metadata and lora_ranks (and lora_b) must not be written by that kernel (kernels/README.md, "Programmatic
// dependent launch"); x and y may be.
void launch_lora_shrink(const LoraShrinkArgs& args, cudaStream_t stream);

// A fixed kernel choice instead of the automatic one (tests, and `punica-bench --kernel shrink=KIND`,
// which ranks kinds under the bench's own checks and timing). automatic = launch_lora_shrink.
// legacy: memset of y, then the per-slice mma tiles (prefill) or the atomic split-K GEMV (decode) as
// before the fused kernel.
// fused / fused_nosplit: the fused prefill kernel (16-bit x, fp32 y, aligned rows) for any T, with
// the automatic split-K choice / with split-K off (every y element written by the kernel).
// fused_sk / fused128_sk: the fused kernel with 64- / 128-token tiles (128 only for adapters of at
// most 6 groups of 16 columns) as stream-K over one wave of resident blocks.
// fused_wk: the fused kernel with automatic's split-K / stream-K choice and the warp-k tile
// wherever the adapters have at most 4 groups of 16 columns, else the 2 x 4 tile.
// fused_wg: the wgmma tile (128 tokens, both operands in shared memory; sm_90a) where
// 16 * S * ceil(R/16) is 32, 48, 64 or 192 and wgmma_available(), else fused.
// cluster: the cluster split-K tile (16-bit x, fp32 y, 16-byte rows, at most 32 blocks of 8 rank
// columns over all slices, an sm_90 device) at any T, else automatic. no_cluster: automatic's choice
// without the cluster tile. small_cluster: automatic's choice with the cluster tile only for small
// batches (shrink_heur::auto_cluster_small) and without the standalone wgmma band (add_lora_linear's
// shrink, heuristics.h says why).
// Shapes a fused kind cannot take (fp32 x or y, unaligned rows) run the automatic path. Which kinds
// exist and why: kernels/lora_shrink/heuristics.h, "Kinds".
enum class ShrinkKernel {
  automatic, legacy, fused, fused_nosplit, fused_sk, fused128_sk, fused_wk, fused_wg, cluster, no_cluster,
  small_cluster
};
// Every kind, automatic first (the order `--kernel` lists them in).
inline constexpr ShrinkKernel kShrinkKernels[] = {
    ShrinkKernel::automatic, ShrinkKernel::legacy,   ShrinkKernel::fused,    ShrinkKernel::fused_nosplit,
    ShrinkKernel::fused_sk,  ShrinkKernel::fused128_sk, ShrinkKernel::fused_wk, ShrinkKernel::fused_wg,
    ShrinkKernel::cluster,   ShrinkKernel::no_cluster, ShrinkKernel::small_cluster};
// The kind's name as `--kernel shrink=NAME` takes it: "auto" for automatic, else the enumerator.
inline const char* kind_name(ShrinkKernel k) {
  switch (k) {
    case ShrinkKernel::automatic: return "auto";
    case ShrinkKernel::legacy: return "legacy";
    case ShrinkKernel::fused: return "fused";
    case ShrinkKernel::fused_nosplit: return "fused_nosplit";
    case ShrinkKernel::fused_sk: return "fused_sk";
    case ShrinkKernel::fused128_sk: return "fused128_sk";
    case ShrinkKernel::fused_wk: return "fused_wk";
    case ShrinkKernel::fused_wg: return "fused_wg";
    case ShrinkKernel::cluster: return "cluster";
    case ShrinkKernel::no_cluster: return "no_cluster";
    case ShrinkKernel::small_cluster: return "small_cluster";
  }
  return "?";
}
void launch_lora_shrink_with(const LoraShrinkArgs& a, ShrinkKernel k, cudaStream_t stream);

// The plan launch_lora_shrink_with(a, k) runs (kernels/lora_shrink/heuristics.h: the kernel family
// and its tile, split-K / stream-K and cluster configuration), from a's sizes, dtypes and pointer
// alignment and the current device's SM count, wgmma and cluster support (cached per device; without
// a GPU: 132 SMs, neither wgmma nor clusters). No device memory is read.
struct ShrinkPlan;
ShrinkPlan lora_shrink_plan(const LoraShrinkArgs& a, ShrinkKernel k = ShrinkKernel::automatic);
// A short stable name of a plan, e.g. "cluster/bm16/nbw4/c8", "fused/bm64/ngw1/splitk8",
// "wgmma/n48/sk264", "decode/token" (the result JSON records it per case).
std::string plan_name(const ShrinkPlan& p);
// plan_name(lora_shrink_plan(a, k)).
std::string describe_lora_shrink_plan(const LoraShrinkArgs& a, ShrinkKernel k = ShrinkKernel::automatic);

// The wgmma tile can run: the build holds sm_90a code (PUNICA_HAVE_SM90A) and the current device is
// 9.0 (false without a device).
bool wgmma_available();

// Host tests of the kernel plans (no GPU): the device traits the choice reads (SM count, wgmma, thread-
// block clusters) taken from here instead of the current device while set; nullptr = the device.
// Never set where kernels launch: the launchers read the same traits.
struct PlanningDevice {
  int num_sms = 132;
  bool wgmma = true, cluster = true;
};
void set_planning_device_override(const PlanningDevice* d);

}  // namespace punica::kernels
