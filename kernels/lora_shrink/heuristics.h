// Host-side launch configuration of lora_shrink (vLLM add_shrink): GEMV split-K on CUDA cores for
// decode-sized batches, mma.sync tiles over tokens grouped by adapter for prefill. Decided from the
// static shape only (T, K, S, max_rank, dtypes): no device value is read, so no synchronisation.
#pragma once
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include "kernels/common/dtype.h"
#include "kernels/lora_shrink/lora_shrink.h"

namespace punica::kernels::shrink_heur {

constexpr int kGemvThreads = 256;   // 8 warps; a warp owns one rank row at a time
constexpr int kGemvChunk = 256;     // k elements per warp step: 32 lanes x 8 (one 16-byte load)
constexpr int kGemvRowBlock = 64;   // rank rows per block (grid splits larger ranks)
constexpr int kGemvTokens = 8;      // tokens sharing one load of A
constexpr int kMaxSplits = 32;      // split-K partials (also bounds add_lora_linear's workspace)
constexpr int kMmaBM = 64;          // tokens per mma tile
constexpr int kMmaBK = 64;          // k per pipeline stage
constexpr int kMmaStages = 4;
constexpr int kMmaThreads = 128;
constexpr int64_t kDecodeMaxTokens = 128;  // at or below: GEMV path
constexpr int kFusedBM = 64;        // fused prefill: tokens per block (all slices, all columns)
constexpr int kFusedThreads = 256;  // 8 warps: 2 (tokens) x 4 (16-column groups)
constexpr int kFusedMaxNGW = 3;     // 16-column groups per warp per pass (pass = 4 * NGW groups)

struct GemvConfig { int nsplit = 1, kc = kGemvChunk, nrowblk = 1; };
struct MmaConfig { int bn = 64, nrc = 1, ksplit = 1, ktiles_per_split = 1; };

inline GemvConfig gemv_config(int64_t K, int max_rank, bool single_pass) {
  GemvConfig c;
  const int64_t chunks = std::max<int64_t>(1, (K + kGemvChunk - 1) / kGemvChunk);
  const int64_t splits = single_pass ? 1 : std::min<int64_t>(chunks, kMaxSplits);
  c.kc = int(((chunks + splits - 1) / splits) * kGemvChunk);
  c.nsplit = int((K + c.kc - 1) / c.kc);
  if (c.nsplit < 1) c.nsplit = 1;
  c.nrowblk = std::max(1, (max_rank + kGemvRowBlock - 1) / kGemvRowBlock);
  return c;
}

// Tensor cores: 16-bit inputs, fp32 output (atomics allow split-K), enough tokens to fill tiles.
inline bool use_mma(DType dtype, DType out_dtype, int64_t T) {
  return dtype != DType::f32 && out_dtype == DType::f32 && T > kDecodeMaxTokens;
}

inline MmaConfig mma_config(int64_t T, int64_t K, int S, int max_rank, int num_sms) {
  MmaConfig c;
  c.bn = max_rank <= 16 ? 16 : max_rank <= 32 ? 32 : 64;
  c.nrc = (max_rank + c.bn - 1) / c.bn;
  const int64_t ktiles = (K + kMmaBK - 1) / kMmaBK;
  const int64_t blocks = ((T + kMmaBM - 1) / kMmaBM) * S * c.nrc;
  // Several waves of blocks for balance; at least 8 k-tiles per block to amortise the pipeline.
  int64_t want = (4 * int64_t(num_sms) + blocks - 1) / std::max<int64_t>(blocks, 1);
  want = std::min<int64_t>(want, std::max<int64_t>(1, ktiles / 8));
  c.ksplit = int(std::max<int64_t>(1, std::min<int64_t>(want, 16)));
  c.ktiles_per_split = int((ktiles + c.ksplit - 1) / c.ksplit);
  c.ksplit = int((ktiles + c.ktiles_per_split - 1) / c.ktiles_per_split);
  return c;
}

// Groups of 16 rank columns an adapter of max_rank spans over all S slices (the padded width / 16).
inline int column_groups(int S, int max_rank) { return S * ((max_rank + 15) / 16); }

// Automatic choice of the fused kernel (measured on H200, H=4096, cold): it beats the per-slice mma
// tiles once the adapter has >= 3 column groups of 16 over all slices (S=3 r=16: 42 vs 53 us;
// S=3 r=64: 65 vs 86 us; S=1 r=64: 44 vs 51 us) but not for S=1 r=16 (41 vs 33 us: one block per
// SM keeps too few bytes in flight), and beats the GEMV from 64 tokens (T=64 S=3: 6.7 vs 11.6 us
// back to back) but not at T=1 (5.2 vs 4.1 us).
// Below 3 groups, from 129 to 1024 tokens with at most 8 adapters the fused kernel also wins
// (LoraShrinkPerf, results/NOTES.md v8, cold: one slice r=16, T=256, 1 adapter: 9.8 vs 13.4 us;
// T=1024, 8 adapters: 12.5 vs 14.5) but not with 32 adapters (T=1024: 17.0 vs 14.8).
constexpr int64_t kFusedMinTokens = 64;
constexpr int64_t kFusedFewGroupsMaxTokens = 1024;
inline bool auto_fused(int64_t T, int S, int max_rank, int max_loras = 0) {
  if (T < kFusedMinTokens) return false;
  if (T <= kDecodeMaxTokens) return true;
  if (T <= kFusedFewGroupsMaxTokens && max_loras <= 8) return true;
  return column_groups(S, max_rank) >= 3;
}

// One slice at rank <= 32 (under 3 column groups, which auto_fused leaves to the per-slice mma tiles
// above 1024 tokens) from kFewGroupsSkMinTokens tokens: the 128-token fused tile with stream-K
// (ShrinkKernel::fused128_sk). The mma tiles' rule above dates from NOTES v8, before the fused
// tiles' stream-K and 128-token variants. LoraShrinkPerf at fa30d5c (H200, T=8192, rank 16, one
// slice; cold after a 256 MiB flush / back to back in a graph): H=4096 8 adapters 32.9 / 23.9 ->
// 29.2 / 22.2 us, 32 adapters 37.3 / 28.3 -> 31.1 / 23.0, H=8192 8 adapters 52.5 / 40.2 -> 47.1 /
// 38.4. Bench A/B (NOTES v33 part 4, 2 rounds, rank 16 one slice, 1 / 8 / 32 adapters, back to back /
// cold): lora_shrink T=4096 0.86 / 0.83 (0.77-0.94), T=8192 0.93 / 0.90 (0.86-0.97); add_lora_linear
// T=2048-8192 0.97 / 0.95-0.97 (0.90-1.01); the T=2048 lora_shrink keeps the cluster tile (auto_cluster
// comes first), 1.00. The sparse-slot bench's T=2048 cases: 0.92-1.03. Two slices at rank 16
// (gate_up) stay as they are: automatic takes a fused tile there already, and LoraShrinkPerf has
// it ahead of fused128_sk (T=8192, 8 adapters, a quarter of the tokens without one: 23.9 / 17.4
// against 25.2 / 18.0 us). Not measured: T above 8192.
constexpr int64_t kFewGroupsSkMinTokens = 2048;
inline bool auto_few_groups_sk(int64_t T, int S, int max_rank) {
  return S == 1 && column_groups(S, max_rank) < 3 && T >= kFewGroupsSkMinTokens;
}

// Stream-K for the automatic fused path when each resident block would get >= 16 k-tiles (T=8192,
// H=4096: 20). Measured on the H200 (lora_shrink_test LoraShrinkPerf, results/NOTES.md v6): 5-22%
// faster cold from T=8192 (qkv r=64: 77 -> 67 us; T=16384 qkv r=16: 66 -> 56 us), but 6-14% slower
// at T=2048 (8 k-tiles per block: the prologue and the tile crossings are not amortised).
constexpr int64_t kStreamKMinAutoIters = 16;
inline bool auto_stream_k(int64_t T, int64_t K, int64_t slots) {
  const int64_t ktiles = (K + 63) / 64, tiles = (T + kFusedBM - 1) / kFusedBM;
  return slots > 0 && tiles * ktiles >= kStreamKMinAutoIters * slots;
}

// Warp-k tile (ShrinkKernel::fused_wk): adapters of at most kWkMaxGroups groups of 16 columns over
// all slices; 7 stages of 64 x-rows and 64 A-rows (112 KB: two blocks fill the SM's shared memory,
// 6 stages of x in flight per block), reused for the 4-way k reduction (72 KB), and 2 blocks per SM
// (launch bounds: its 64 fp32 accumulators per thread). 4 stages measured the same within run-to-run
// noise (NOTES v9): bytes in flight do not bound it.
constexpr int kWkMaxGroups = 4;
constexpr int kWkStages = 7;
constexpr int kWkLdr = kWkMaxGroups * 16 + 8;
constexpr std::size_t kWkSmem = std::max<std::size_t>(std::size_t(kWkStages) * (64 * 128 + kWkMaxGroups * 16 * 128),
                                                      std::size_t(4) * 64 * kWkLdr * 4);
inline bool wk_fits(int S, int max_rank) { return column_groups(S, max_rank) <= kWkMaxGroups; }

// The warp-k tile on the automatic path: adapters of 2 to 4 column groups over all slices (qkv r=16,
// gate_up r=16, one slice r=64) where stream-K takes long ranges (auto_stream_k, with its 2 blocks
// per SM). Measured on the H200 (LoraShrinkPerf, NOTES v9, back to back, two runs): T=8192 H=4096
// qkv r=16 26.5-26.7 against 28.0 us, gate_up r=16 with 25% of tokens without an adapter 22.2-22.6
// against 24.1-24.4, one slice r=64 27.7-28.2 against 30.2, T=16384 qkv r=16 43.6-45.7 against 48.0.
// Not for one group (T=8192 H=8192 r=16: 40.4-42.8 against 39.8-40.9) nor shorter ranges (T=2048
// qkv r=16: 15.2-15.9 against 12.6, its 4-way k reduction and 2 blocks per SM over 8 k-tiles).
// Also from 256 to 1024 tokens with at least 32 adapters and 3 or 4 groups (one slice r=64, qkv
// r=16; NOTES v21, LoraShrinkPerf.DISABLED_MidBatch, 32 adapters, cold / graph against the fused
// tile taken before): H=4096 0.85-0.96 / 0.73-0.76, H=8192 0.97-1.00 / 0.89-0.92. Not with 8
// adapters at T=256 (qkv r=16: 0.96 / 1.19; one slice r=64 1.00 / 1.01).
constexpr int64_t kWkMidMinTokens = 256, kWkMidMaxTokens = 1024, kWkMidMinLoras = 32;
inline bool auto_wk(int64_t T, int64_t K, int S, int max_rank, int num_sms, int64_t max_loras) {
  if (!wk_fits(S, max_rank)) return false;
  const int g = column_groups(S, max_rank);
  if (g >= 3 && T >= kWkMidMinTokens && T <= kWkMidMaxTokens && max_loras >= kWkMidMinLoras) return true;
  return g >= 2 && auto_stream_k(T, K, 2 * int64_t(num_sms));
}

// Fused prefill (x streamed once for all slices and columns): groups of 16 columns per warp per
// pass from the static padded rank, pipeline depth from the shared memory per stage (two blocks
// per SM), and split-K (y zeroed first, atomics) when the token tiles fill fewer than ~3 blocks per SM.
// stream_k: grid of sk_blocks resident blocks sharing the (tile, k-tile) iterations equally
// (fused_config's `stream_k`); ksplit = 1 then, and y is zeroed first as for split-K.
// wgmma tile (ShrinkKernel::fused_wg; sm_90a): N = 16 * S * ceil(R / 16) columns, one of
// 32, 48, 64, 192; stages of 128 x-rows and N A-rows (+1 KB to align them to 1024 bytes); two
// blocks per SM up to N = 64 (4 stages, <= 97 KB), one above (5 stages, 201 KB; 96 accumulators).
inline int wg_columns(int S, int max_rank) {
  const int n = 16 * column_groups(S, max_rank);
  return (n == 32 || n == 48 || n == 64 || n == 192) ? n : 0;
}
constexpr int wg_stages(int n) { return n > 64 ? 5 : 4; }
constexpr std::size_t wg_smem(int n) { return std::size_t(wg_stages(n)) * (128 * 128 + std::size_t(n) * 128) + 1024; }

// The wgmma tile on the automatic path (the device must be sm_90 and the build hold sm_90a code;
// the caller checks that). Its 128-token tiles need full tiles: on average at least 256 tokens per
// adapter (the host knows only T and max_loras). Measured on the H200 (LoraShrinkPerf, NOTES v10,
// three runs each, cold / back to back, us):
// - N = 192 (qkv r=64) from T=512: T=8192 8 adapters 50.9/44.8 against 61.3/58.0, 32 adapters
//   67.5/57.5 against 74.5/67.5, T=512-1024 one adapter 17.4-18.6 against 20.8-26.0 cold; not at 128
//   tokens per adapter (T=4096 32 adapters: 54.1 against 48.6 cold) nor at T=256 (the shrink ties,
//   17.0 against 16.9, but add_lora_linear measured 26.4 against 24.4 us in the bench, fb6cf10).
// - N = 32, 48 (gate_up, qkv r=16) from T=4096: the Llama-3-8B layer shapes (25% of tokens without
//   an adapter) 26.2/18.6 against 29.5/24.4 (gate_up) and 27.9/20.4 against 31.7/24.3 (qkv); T=16384
//   qkv 51.1 against 53.8; T=8192 qkv, every token with an adapter: 34.5 against 33.8 (the one
//   loss); not at T=2048 (19.0 against 17.4 cold).
// - N = 64 (one slice r=64) up to T=1024: T=512-1024 H=8192, one adapter, 13.0-15.8 against 15.1-18.3
//   cold; not at T=8192 (36.9 against 35.4; the warp-k tile there).
// - 512-1024 tokens with at least 64 tokens per adapter (NOTES v21, LoraShrinkPerf.DISABLED_MidBatch,
//   cold / graph against the kernel taken before): N = 48 T=512-1024 with 1 or 8 adapters
//   0.87-0.92 / 0.77-0.83; N = 64 T=512-1024 with 8 adapters 0.85-0.91 / 0.76-0.95. Not with 32
//   tokens per adapter (N = 64 T=1024 32 adapters 1.10 / 1.08) nor at T=256 (N = 48: 0.93-0.95
//   cold but 1.14-1.23 in a graph). Bench A/B of this rule and auto_wk's mid-batch one (NOTES v21
//   part 3, T=256/512/1024): lora_shrink 0.79-0.95 back to back where taken, add_lora_linear
//   0.91-0.97 except qkv r=16 one adapter T=512 (1.05) and mixed ranks 8 adapters T=1024 (1.04).
constexpr int64_t kWgMidMinTokens = 512, kWgMidMaxTokens = 1024, kWgMidMinPerAdapter = 64;
// the other ranges (above): at least 256 tokens per adapter; N = 192 from 512 tokens, N = 64 up to
// 1024, N = 32 / 48 from 4096
constexpr int64_t kWgMinPerAdapter = 256, kWg192MinTokens = 512, kWg64MaxTokens = 1024, kWgNarrowMinTokens = 4096;
inline bool auto_wg(int64_t T, int S, int max_rank, int64_t max_loras) {
  const int n = wg_columns(S, max_rank);
  if (n == 0) return false;
  const int64_t L = std::max<int64_t>(1, max_loras);
  if ((n == 48 || n == 64) && T >= kWgMidMinTokens && T <= kWgMidMaxTokens && T >= kWgMidMinPerAdapter * L)
    return true;
  if (T < kWgMinPerAdapter * L) return false;
  if (n == 192) return T >= kWg192MinTokens;
  if (n == 64) return T <= kWg64MaxTokens;
  return T >= kWgNarrowMinTokens;
}

// The wgmma tile for N = 48 (qkv r=16) and N = 64 (one slice r=64, mixed ranks up to 64) between
// auto_wg's ranges, in a standalone lora_shrink only: N = 64 from 1025 to 3072 tokens, N = 48 from
// 1536 to 4095, each with auto_wg's 256 tokens per adapter. Found by ranking every kernel kind under
// the bench's own timing (`--kernel`, scripts/lab/kernel_sweep_device.sh, results/NOTES.md v35 parts 1-2;
// the perf tests of NOTES v10 had put N = 48 behind at T=2048). Bench A/B of one binary with the
// bounds as knobs (H200, one round, back to back / cold against the kernel taken before): one slice
// r=64 with 1 or 8 adapters 0.85-1.00 / 0.86-1.02 at T=1536-3072, and at T=4096 0.87-0.91 for H=4096
// but 0.99-1.03 for H=8192 (so the N = 64 band ends at 3072); qkv r=16 T=1536-3072 0.85-0.98 /
// 0.87-1.00; mixed ranks 8/16/64 one slice 0.88-0.91. This rule against the kernels before it (2
// rounds): the 17 bench shrinks it takes median 0.89 / 0.91 (0.83-1.00 / 0.86-1.01: one slice H=4096
// T=2048 with one adapter ties), the 18 hinted sparse-slot shrinks 0.89 / 0.91 (0.81-0.99 /
// 0.84-1.02), every other case 0.96-1.01 / 0.98-1.02. Not inside add_lora_linear, whose chain did not
// gain over the same shapes (0.96-1.06, one round; its expand launches early as a programmatic
// dependent).
// Where K <= 4096 the N = 64 band runs to 4096 tokens (results/NOTES.md v36-v37: fused_wg against
// automatic at H=4096, one slice r=64, T=3840 0.84-0.87 and T=4096 0.87-0.91 with 1-8 adapters; H=8192
// at T=4096 did not gain, 0.99-1.03).
constexpr int64_t kWgBand64MaxTokens = 3072, kWgBand64MaxTokensNarrowK = 4096, kWgBand64NarrowK = 4096,
                  kWgBand48MinTokens = 1536;
inline bool auto_wg_band(int64_t T, int S, int max_rank, int64_t max_loras, int64_t K) {
  const int n = wg_columns(S, max_rank);
  if (T < kWgMinPerAdapter * std::max<int64_t>(1, max_loras)) return false;
  if (n == 64)
    return T > kWg64MaxTokens && T <= (K <= kWgBand64NarrowK ? kWgBand64MaxTokensNarrowK : kWgBand64MaxTokens);
  if (n == 48) return T >= kWgBand48MinTokens && T < kWgNarrowMinTokens;
  return false;
}

struct FusedConfig {
  int bm = kFusedBM, ngw = 1, stages = 4, ksplit = 1, ktiles_per_split = 1;
  bool wk = false;
  int wg_n = 0;  // > 0: the wgmma tile with that many columns (bm = 128)
  bool stream_k = false;
  int sk_blocks = 0;
  std::size_t smem = 0;
};
constexpr int kStreamKMinIters = 8;  // k-tiles per stream-K block: the host's rule for choosing stream-K
// The device's floor of k-tiles per stream-K block (G = min(resident blocks, W / this), W = the real
// (tile, k-tile) iterations). It binds only where the host chose stream-K for more tiles than the
// batch has: few adapters in many slots. 8 until v29; 4 measured on the H200 (bench A/B of one
// binary under PUNICA_SK_MIN_ITERS = 8 / 4 / 2, results/NOTES.md v29 part 1, bench_sparse_slots
// T=64 / 256 with 1, 2 or 8 adapters in 32 slots, 2 rounds, back to back / cold): qkv r=64 T=64 one
// adapter 13.55 -> 10.63 us (0.78 / 0.81); 22 of the 72 cases 0.78-0.94 (qkv, or rank 64), the
// other 50 0.97-1.02; the dense bench's shrinks T=64-8192 0.90-1.02 (one round; the floor does not
// bind there). 2 was faster still at qkv
// r=64 (3 groups per warp, 8 adapters: 0.83 of 4's time) but 1.05-1.07 slower at one slice r=64
// T=256, whose ranges are then mostly prologue.
constexpr int kStreamKMinBlockIters = 4;

// Split-K over the k-tiles when the token tiles fill fewer than `target` blocks: up to ~target
// blocks, at least 4 k-tiles per split, at most 16 splits (both tile kinds of fused_config); `wide`:
// at least 2 k-tiles per split, at most 32 splits (fused_config's rule below). `one_wave`: the split
// count rounds down, so tiles x splits never passes `target` (the wgmma tile's; results/NOTES.md v37:
// rounding up made T=3328 at K=4096 286 blocks on 264 slots, a thin second wave); otherwise it rounds
// up, as measured for the mma tiles (NOTES v6).
inline void set_split_k(FusedConfig& c, int64_t tiles, int64_t ktiles, int64_t target, bool allow_split,
                        bool wide = false, bool one_wave = false) {
  int64_t ks = 1;
  if (allow_split && tiles < target) {
    const int64_t t = std::max<int64_t>(tiles, 1);
    ks = one_wave ? target / t : (target + t - 1) / t;
    ks = std::min<int64_t>(ks, std::max<int64_t>(1, ktiles / (wide ? 2 : 4)));
    ks = std::max<int64_t>(1, std::min<int64_t>(ks, wide ? 32 : 16));
  }
  c.ktiles_per_split = int((ktiles + ks - 1) / ks);
  c.ksplit = int((ktiles + c.ktiles_per_split - 1) / c.ktiles_per_split);
}

// bm = 128 (ShrinkKernel::fused128_sk, automatic's auto_few_groups_sk; always stream-K): 4 x 2 warps, a pass covers 2 * ngw groups of 16
// columns; only for adapters of at most 6 groups (more falls back to bm = 64).
// stream_k: instead of a split-K grid, one block per resident slot (blocks per SM by shared memory,
// at most 3, x SMs), each taking an equal contiguous range of the (tile with an adapter, k-tile)
// iterations: one wave in which every block works to the end. The split-K grid rounds to whole
// (tile, split) blocks: T=8192 qkv r=16 made 512 blocks for 396 slots, a second wave of 116
// latency-bound blocks; a device-side split fitted to one wave (an experiment, results/NOTES.md
// v6) ran those shapes 10-20% faster but left waves 30-45% empty elsewhere (qkv r=64 with 32
// adapters: 148 tiles on 264 slots, 96 us against 75).
inline FusedConfig fused_config(int64_t T, int64_t K, int S, int max_rank, int num_sms, bool allow_split = true,
                                int bm = kFusedBM, bool stream_k = false,
                                bool auto_sk = false, int64_t max_loras = 0, bool wk = false, bool wg = false) {
  FusedConfig c;
  if (wg && wg_columns(S, max_rank) > 0) {
    // 128-token tiles, the same split-K / stream-K rules over them
    c.wg_n = wg_columns(S, max_rank);
    c.bm = 128;
    c.stages = wg_stages(c.wg_n);
    c.smem = wg_smem(c.wg_n);
    const int64_t resident = c.wg_n > 64 ? 1 : 2;
    const int64_t ktiles = std::max<int64_t>(1, (K + 63) / 64);
    const int64_t tiles = (T + 127) / 128;
    const int64_t slots = resident * int64_t(num_sms);
    if (allow_split && auto_sk && tiles * ktiles >= int64_t(kStreamKMinIters) * slots) {
      c.stream_k = true;
      c.sk_blocks = int(slots);
      return c;
    }
    // Each adapter's tokens start a tile (v26), so the grid holds more tiles than T / 128 when adapters
    // split the batch off 128-token boundaries: count them as if the tokens split evenly over the
    // planned adapters (the host knows no more; T=3328 with 8 adapters: 8 x 4 = 32 tiles, not 26),
    // and round the split down so those tiles x splits fit one wave of slots.
    const int64_t lo = std::max<int64_t>(1, std::min<int64_t>(max_loras, T));
    const int64_t tiles_even = std::max(tiles, lo * (((T + lo - 1) / lo + 127) / 128));
    set_split_k(c, tiles_even, ktiles, slots, allow_split, false, /*one_wave=*/true);
    return c;
  }
  const int ng = column_groups(S, max_rank);
  c.bm = bm == 128 && ng <= 6 ? 128 : kFusedBM;
  const int wn = 8 / (c.bm / 32);  // warps along the column groups
  c.ngw = ng <= wn ? 1 : ng <= 2 * wn ? 2 : kFusedMaxNGW;
  c.stages = c.ngw == 3 ? 3 : 4;
  c.smem = std::size_t(c.stages) * (std::size_t(c.bm) * 128 + std::size_t(wn) * c.ngw * 16 * 128);
  c.wk = wk && c.bm == kFusedBM && wk_fits(S, max_rank);
  if (c.wk) {
    c.ngw = 1;
    c.stages = kWkStages;
    c.smem = kWkSmem;
  }
  const int64_t ktiles = std::max<int64_t>(1, (K + 63) / 64);
  const int64_t tiles = (T + c.bm - 1) / c.bm;
  // Under ~0.9 wave of token tiles: split K to ~2 blocks per SM (measured best at T=2048: a finer
  // split, 13-way, was 10-25% slower there for r=64, git c8d63ac). From ~1 to 3 waves of tiles:
  // ncu on the H200 (T=8192, qkv r=16, 32 adapters) showed 161 blocks, 12.5% achieved occupancy
  // and 46% of DRAM bandwidth without split-K; splitting until ~3 blocks per SM (the smem limit)
  // made T=8192 up to 1.24x faster (git c8d63ac, results/history/c8d63ac87ea2/bench_lora_ops_prefill.json.gz at commit aa3e837).
  // Never more per SM than fit: with 2 or 3 column groups per warp (>= 96 KB of stages) only 2 blocks
  // are resident, and aiming at 3 made qkv r=64 T=8192 11% slower (70.2 vs 62.7 us, git 2c77476
  // against 98d3c40), so those shapes keep the 2-per-SM split (this rule itself not re-measured:
  // the session's device time ran out).
  const int64_t fit = int64_t(std::size_t(227 * 1024) / (c.smem + 1024));  // 227 KB of shared memory per SM
  const int64_t resident = std::max<int64_t>(1, std::min<int64_t>(c.wk ? 2 : 3, fit));
  const int64_t per_sm = tiles * 10 < int64_t(num_sms) * 9 ? 2 : resident;
  const int64_t target = per_sm * int64_t(num_sms);
  if (auto_sk && allow_split && bm == kFusedBM) stream_k = auto_stream_k(T, K, resident * int64_t(num_sms));
  if (stream_k && allow_split) {
    c.stream_k = true;
    c.sk_blocks = int(resident * int64_t(num_sms));
    return c;  // ksplit = 1, ktiles_per_split unused
  }
  // Up to 32 splits of >= 2 k-tiles for the 2 x 4 tile with one group of 16 columns per warp (at
  // most 4 groups over all slices: one slice up to rank 64, qkv r=16) up to 256 tokens: its partial
  // sums are at most 64 x 64 per block, 16-byte atomics since v27. Measured on the H200 (bench A/B,
  // exp/sk32v4 against 00a6211, T=256 / 2048, 2 rounds, results/NOTES.md v27 part 3, back to back /
  // cold): one slice r=64 T=256 0.90-0.98 / 0.95-1.00 (H=8192 one adapter 9.26 -> 8.37 us), mixed
  // ranks one slice 0.91, add_lora_linear 0.93-0.99 (qkv r=16 one adapter 9.78 -> 9.06). Not with
  // 3 groups per warp (qkv r=64, one adapter: 10.72 -> 12.12 us; each block's 64 x 192 partial sums
  // and its ~840-instruction prologue per warp, ncu, against 2 k-tiles of work) nor for the warp-k tile
  // (0.99-1.00); T=2048 does not reach 16 splits; 257-1024 tokens not measured.
  set_split_k(c, tiles, ktiles, target, allow_split, c.ngw == 1 && !c.wk && T <= 256);
  // The split-K grid is cut for ceil(T/64) tiles, but every adapter owns at least one (partial)
  // tile: with many adapters and few tokens the real (tile, split) blocks pass one wave of
  // resident blocks and a thin second wave follows. Stream-K there (one wave, tiles counted on the
  // device). Measured (LoraShrinkPerf, results/NOTES.md v8, cold, 32 adapters): one slice H=8192
  // r=64, T=128..1024: 21.3-27.3 against 24.4-29.0 us; qkv r=64, T=128..4096: 29.7-49.1 against
  // 32.7-57.9; not with 8 adapters up to T=1024 (their blocks fit one wave: 14.0 against 14.9).
  if (auto_sk && allow_split && bm == kFusedBM && c.ksplit > 1) {
    const int64_t tiles_est = std::max<int64_t>(tiles, std::min<int64_t>(max_loras, T));
    if (tiles_est * c.ksplit > resident * int64_t(num_sms)) {
      c.stream_k = true;
      c.sk_blocks = int(resident * int64_t(num_sms));
      c.ksplit = 1;
    }
  }
  return c;
}

// Decode kernel (shrink_decode.cu): 8 warps split K; a block owns kDecRowsPerToken rank rows of
// one token (slot from token_lora_mapping, when the batch averages under two tokens per adapter)
// or kDecRowsPerTile rows of up to kDecTokens tokens of one adapter. Chosen automatically for
// T <= kDecodeKernelMaxTokens and for every shape the mma / fused kernels do not take.
constexpr int kDecThreads = 256;
constexpr int kDecTokens = 4;  // token tiles (T > 65535 only)
constexpr int kDecRowsPerToken = 2;
constexpr int kDecRowsPerTile = 4;
constexpr int64_t kDecodeKernelMaxTokens = 128;
// One token per block beat token tiles everywhere measured (H200, T=1..64): tiles only past 65535.
inline bool decode_per_token(int64_t T, int /*max_loras*/) { return T <= 65535; }
// Decode kernel or the fused mma kernel (with its split-K) for 64 <= T <= 128: fused wins once the
// adapters own many rank columns (S * r >= 192: qkv r=64 T=64, 11.6 vs 20.3 us) or many tokens
// each with S * r >= 64 (one slice r=64, 8 adapters: 8.2 vs 8.7 us); the decode kernel wins for
// r=16 and for 32 adapters (one slice r=64: 10.0 vs 14.1 us).
inline bool use_decode_kernel(int64_t T, int S, int max_rank, int max_loras) {
  if (T > kDecodeKernelMaxTokens) return false;
  if (T < kFusedMinTokens) return true;
  const int64_t cols = int64_t(S) * max_rank;
  return !(cols >= 192 || (cols >= 64 && T >= 8 * int64_t(max_loras)));
}
// The warp-k tile inside the decode kernel's band (64 <= T <= 128), taken ahead of it, for the
// adapters auto_wk's mid-batch rule serves (>= 32 planned adapters, 3-4 column groups) once they
// average enough tokens each that the decode kernel's per-token reads of A repeat: >= 3 per
// adapter with 4 groups (one slice r=64), >= 4 with 3 (qkv r=16). Measured on the H200 (bench A/B by
// axis override, 32 adapters, 3 interleaved rounds, back to back / cold; results/NOTES.md v34
// part 1): one slice r=64 H=8192 T=96 / 112 / 128 0.80 / 0.72 / 0.66 (T=128: 25.0 -> 16.4 us),
// H=4096 0.92 / 0.83 / 0.75, add_lora_linear 0.74-0.93; qkv r=16 T=128 0.90 / 0.86
// (add_lora_linear 0.93). Not below: one slice r=64 at T=80 (2.5 per adapter) 0.91 at H=8192 but
// 1.04 at H=4096; qkv r=16 at T=80 / 96 1.26 / 1.12, T=112 1.00. With more adapters the per-adapter
// bound keeps the decode kernel everywhere in the band (64 adapters would need 192 tokens).
constexpr int64_t kWkBandMinTokensPerLora4 = 3, kWkBandMinTokensPerLora3 = 4;
inline bool auto_wk_decode_band(int64_t T, int S, int max_rank, int64_t max_loras) {
  if (T < kFusedMinTokens || T > kDecodeKernelMaxTokens || max_loras < kWkMidMinLoras || !wk_fits(S, max_rank))
    return false;
  const int g = column_groups(S, max_rank);
  if (g < 3) return false;
  return T >= (g >= 4 ? kWkBandMinTokensPerLora4 : kWkBandMinTokensPerLora3) * max_loras;
}

// Cluster split-K tile (shrink_cluster.cu; sm_90 thread-block clusters): a CTA owns BM = 16 * mg
// tokens of one adapter (tiles over the sorted tokens, the -1 entry's included: their zero rows),
// nbw blocks of 8 rank columns over all slices (a column group; ncg groups cover S * ceil(R / 8)
// blocks), and 1 / C of K; its kClThreads / 32 warps split that range by 32-element chunks, loading
// x and A straight into mma.sync fragments (16-byte loads; k permuted identically in both operands),
// and the C CTAs of a cluster sum their partials through distributed shared memory, each storing
// 1 / C of the tile's rows. Every y element is written once: no zero kernel, no atomics,
// deterministic. Up to kClMaxBlocks blocks of 8 columns over all slices (S * ceil(R / 8)).
constexpr int kClThreads = 128;
constexpr int kClMaxNbw = 8;
constexpr int kClMaxBlocks = 32;
constexpr int kClMaxCluster = 8;  // the portable cluster size
constexpr int kClCtasPerSm = 2;   // the grid the configuration aims for (the kernel's occupancy)
struct ClusterConfig {
  int mg = 2, nbw = 8, ncg = 1, cluster = 1, chunks_per_cta = 1;
  int64_t tiles = 0;  // upper bound of the token tiles (grid z)
};
// Blocks of 8 rank columns an adapter of max_rank spans over all S slices.
inline int cluster_blocks(int S, int max_rank) { return S * ((max_rank + 7) / 8); }
inline bool cluster_fits(int S, int max_rank) {
  return max_rank > 0 && cluster_blocks(S, max_rank) <= kClMaxBlocks;
}
// Clusters of C CTAs along K until the grid holds ~2 CTAs per SM (the kernel's occupancy), each
// warp keeping at least one 32-element chunk; 16-token tiles (mg = 1) where 32-token tiles would
// not reach that many CTAs even with C = 8.
inline ClusterConfig cluster_config_nbw(int64_t T, int64_t K, int blocks, int nbw, int64_t max_loras, int num_sms) {
  ClusterConfig c;
  c.nbw = nbw;
  c.ncg = (blocks + nbw - 1) / nbw;
  const int64_t target = int64_t(kClCtasPerSm) * num_sms;
  const int64_t extra = std::min<int64_t>(std::max<int64_t>(max_loras, 0) + 1, T);  // partial tile per entry
  const int64_t tiles32 = (T + 31) / 32 + extra;
  c.mg = tiles32 * c.ncg * kClMaxCluster < target ? 1 : 2;
  c.tiles = (T + 16 * c.mg - 1) / (16 * c.mg) + extra;
  const int64_t nch = std::max<int64_t>(1, (K + 31) / 32);
  const int warps = kClThreads / 32;
  int C = 1;
  while (C < kClMaxCluster && C * int64_t(c.ncg) * c.tiles < target && nch >= int64_t(2 * C) * warps) C *= 2;
  c.cluster = C;
  c.chunks_per_cta = int((nch + C - 1) / C);
  return c;
}
// Column groups as wide as possible (8 blocks; all of an adapter's blocks when fewer). In small
// batches (T <= kClSmallMaxTokens) where that grid stays under ~2 CTAs per SM even with C = 8,
// narrower groups (4, then 2 blocks) multiply the CTAs: x is then re-read once per group (from L2),
// A is not. Larger batches keep the wide groups (at T=256 narrowing qkv r=16 from 6 to 4 blocks per
// group measured 1.03-1.21x slower back to back, results/NOTES.md v20 part 1).
constexpr int64_t kClSmallMaxTokens = 128;
inline ClusterConfig cluster_config(int64_t T, int64_t K, int S, int max_rank, int64_t max_loras, int num_sms) {
  const int blocks = cluster_blocks(S, max_rank);
  int nbw = blocks <= kClMaxNbw ? std::min(kClMaxNbw, ((blocks + 1) / 2) * 2) : kClMaxNbw;
  ClusterConfig c = cluster_config_nbw(T, K, blocks, nbw, max_loras, num_sms);
  const int64_t target = int64_t(kClCtasPerSm) * num_sms;
  while (T <= kClSmallMaxTokens && nbw > 2 && int64_t(c.cluster) * c.ncg * c.tiles < target) {
    nbw = nbw > 4 ? 4 : 2;
    c = cluster_config_nbw(T, K, blocks, nbw, max_loras, num_sms);
  }
  return c;
}
// The automatic lora_shrink takes the cluster tile (16-bit x, fp32 y, 16-byte rows, an sm_90 device)
// where it measured faster on the H200 (bench_lora_ops, exp/shrink-cluster-wide against 7d0a50e,
// results/NOTES.md v19; back to back / cold):
// - at most 2 blocks of 8 columns over all slices (one slice, rank <= 16), 129 <= T <= 2048, any
//   number of adapters: T=256 0.57-0.76 / 0.81-0.89 of the atomic split-K path's time (H=4096 r=16,
//   one adapter: 3.99 against 6.69 us back to back), T=2048 0.77-0.89 / 0.86-0.93;
// - 3 to 6 blocks (qkv or gate_up at rank 16, one slice up to rank 48) with at most 8 adapters up to
//   T=256: qkv r=16 0.74-0.77 / 1.00-1.08.
// Not elsewhere: 8 blocks and more (rank 64) were 0.80-1.01 back to back but 1.09-1.29 cold at
// T=256 and 1.4-2.6x slower at T=2048; qkv r=16 1.7x slower at T=2048; 32 adapters of rank 64 or
// 3 slices 1.1-1.6x slower (each adapter's A re-read per 16/32-token tile); T=16-64 (the decode
// kernel) 1.1-2x slower at rank 16; T=8192 1.1-3.5x slower.
// add_lora_linear does not take it for these mid-sized batches (ShrinkKernel::small_cluster
// takes only auto_cluster_small below): its chain measured 0.90-1.16 of the atomic path's there
// (T=256 one slice r=16, one adapter: 10.59 against 9.68 us back to back).
constexpr int64_t kClMinTokens = 129;
constexpr int64_t kClMaxTokens = 2048;
constexpr int64_t kClNarrowMaxTokens = 256;
// Small batches (32 <= T <= 128) with at least 3 blocks of 8 columns (rank > 16 or several
// slices; below 64 tokens at least 8 blocks) and >= 8 tokens per adapter: the narrow-group cluster
// tile instead of the atomic split-K mma path (a zero kernel, then 64-token tiles over a few tokens)
// or the decode kernel (A re-read per token). Measured on the H200 (bench_lora_ops at T=64 and, by
// axis override, T=32 / 128; exp/cluster-narrow against a9b7362, 2 interleaved rounds, back to
// back / cold; results/NOTES.md v20 part 1): one slice r=64 with one adapter 0.56-0.80 / 0.82-0.91
// (H=4096 T=64: 7.05 -> 3.94 us), 8 adapters 0.66-0.79 / 0.90-0.98; qkv r=16 0.38-0.76 / 0.55-0.89
// (T=128 one adapter 10.70 -> 4.11 us); qkv r=64 0.44-0.77 / 0.57-0.95; mixed ranks 8/16/64
// 0.65-0.79 / 0.86-0.93; inside add_lora_linear 0.62-0.98 / 0.68-1.02. Not below 8 tokens per
// adapter (32 adapters at T=64: 1.2-2.0x slower, each CTA then holds a 2-token tile), not at T=16
// (the decode kernel: 1.1-1.8x slower, except qkv r=64 with one adapter: below), not for <= 2 blocks
// (1.1-1.2x slower), not for 6 blocks at T=32 (qkv r=16, one adapter: the decode kernel's 3.06
// against 3.45 us).
constexpr int64_t kClSmallMinTokens = 32;
// Below 32 tokens (16 to 31) only the widest shapes, all tokens of one adapter (>= 16 per adapter)
// over >= 24 blocks (qkv r=64): there the decode kernel re-reads A's 3 x 64 rows per token (v20 c1:
// the tile 0.75 of its time). Bench A/B (results/NOTES.md v25 part 2, back to back): qkv r=64 one
// adapter T=16 5.95 -> 4.43 us, add_lora_linear there 9.85 -> 8.50.
constexpr int64_t kClTinyMinTokens = 16;
constexpr int kClTinyMinBlocks = 24;
constexpr int64_t kClTinyMinTokensPerLora = 16;
constexpr int64_t kClSmallWideMinTokens = 64;  // from here 3 blocks suffice; below, 8
constexpr int kClSmallMinBlocks = 3;
constexpr int64_t kClSmallMinTokensPerLora = 8;
inline bool auto_cluster_small(int64_t T, int S, int max_rank, int64_t max_loras) {
  if (T > kClSmallMaxTokens || !cluster_fits(S, max_rank)) return false;
  const int blocks = cluster_blocks(S, max_rank);
  if (T < kClSmallMinTokens && !(T >= kClTinyMinTokens && blocks >= kClTinyMinBlocks &&
                                 T >= kClTinyMinTokensPerLora * std::max<int64_t>(1, max_loras)))
    return false;
  if (blocks < (T >= kClSmallWideMinTokens ? kClSmallMinBlocks : kClMaxNbw)) return false;
  return T >= kClSmallMinTokensPerLora * std::max<int64_t>(1, max_loras);
}
inline bool auto_cluster(int64_t T, int S, int max_rank, int64_t max_loras) {
  if (auto_cluster_small(T, S, max_rank, max_loras)) return true;
  if (T < kClMinTokens || !cluster_fits(S, max_rank)) return false;
  const int blocks = cluster_blocks(S, max_rank);
  if (blocks <= 2) return T <= kClMaxTokens;
  return blocks <= 6 && T <= kClNarrowMaxTokens && max_loras <= 8;
}

}  // namespace punica::kernels::shrink_heur

namespace punica::kernels {

// ---------------------------------------------------------------- the plan
// One call's kernel family and its configuration (shrink_heur::plan; lora_shrink_plan fills the
// inputs from the Args and the current device). launch_lora_shrink(_with) runs exactly this plan.
//
// Kinds (ShrinkKernel, `--kernel shrink=`), kept where the automatic choice takes the kernel they
// force or a test / the kernel sweep needs them: legacy (the mma tiles and the atomic GEMV that
// automatic takes for fp32 or unaligned inputs; the tests' and sweeps' baseline), fused /
// fused_nosplit / fused_sk (the 64-token fused tile that automatic takes, with split-K forced on /
// off / as stream-K: the tests cover each y-writing mode), fused128_sk (auto_few_groups_sk), fused_wk
// (auto_wk, auto_wk_decode_band), fused_wg (auto_wg, auto_wg_band), cluster (auto_cluster),
// no_cluster (the ranking baseline of the cluster rules) and small_cluster (add_lora_linear's shrink).
// Deleted (issue 42): fused128, the 128-token tile with a split-K grid, which no rule took.
enum class ShrinkPath {
  none,     // nothing to write (T = 0 or max_rank = 0)
  zero,     // y zeroed by a memset (no adapter slot or K = 0)
  cluster,  // shrink_cluster.cu, the cluster split-K tile
  decode,   // shrink_decode.cu, one block per token (or token tile)
  fused,    // shrink_fused.cu, the fused tile (2 x 4, warp-k or wgmma) with split-K / stream-K
  mma,      // shrink_legacy.cu, the per-slice mma tiles
  gemv      // shrink_legacy.cu, the split-K GEMV
};
// How y is zeroed before the kernel: not (the kernel writes every element), by cudaMemsetAsync, or
// by the zero kernel (its programmatic dependents start while it runs).
enum class ShrinkZero { none, memset, kernel };
struct ShrinkPlan {
  ShrinkPath path = ShrinkPath::none;
  ShrinkZero zero = ShrinkZero::none;
  bool pdl = false;        // gemv: a programmatic dependent of the zero kernel
  bool per_token = true;   // decode: one token per block (else tiles of kDecTokens)
  bool atomic = false;     // gemv: fp32 atomics (else stores)
  shrink_heur::ClusterConfig cluster;
  shrink_heur::FusedConfig fused;
  shrink_heur::MmaConfig mma;
  shrink_heur::GemvConfig gemv;
};
// What the choice reads of one call (lora_shrink_plan fills it from LoraShrinkArgs).
struct ShrinkShape {
  DType dtype = DType::bf16, out_dtype = DType::f32;
  int64_t T = 0, K = 0;
  int S = 1, R = 0, L = 0;
  int planned = 0;   // planned_loras(L, num_active_loras): the adapters the rules plan for
  bool vec = false;  // x rows and A rows 16-byte aligned (shrink_vec_ok)
};
// What it reads of the device (lora_shrink_plan: num_sms_cached, wgmma_available, cluster_available).
struct ShrinkDevice {
  int num_sms = 132;
  bool wgmma = false;
  bool cluster = false;
};

namespace shrink_heur {
// The rules in order; the first that takes the call decides (heuristics_test pins the order).
inline ShrinkPlan plan(const ShrinkShape& s, ShrinkKernel kind, const ShrinkDevice& d) {
  using K = ShrinkKernel;
  ShrinkPlan p;
  if (s.T == 0 || s.R == 0) return p;
  if (s.L == 0 || s.K == 0) {
    p.path = ShrinkPath::zero;
    p.zero = ShrinkZero::memset;
    return p;
  }
  const int lh = s.planned;
  // 1. the cluster tile (auto_cluster; small_cluster: auto_cluster_small only)
  const bool want_cluster = kind == K::cluster || (kind == K::automatic && auto_cluster(s.T, s.S, s.R, lh)) ||
                            (kind == K::small_cluster && auto_cluster_small(s.T, s.S, s.R, lh));
  const bool cluster_ok =
      s.dtype != DType::f32 && s.out_dtype == DType::f32 && cluster_fits(s.S, s.R) && d.cluster && s.vec;
  if (want_cluster && cluster_ok) {
    p.path = ShrinkPath::cluster;
    p.cluster = cluster_config(s.T, s.K, s.S, s.R, lh, d.num_sms);
    return p;
  }
  // Not the cluster tile (for `cluster`: a shape the tile does not take): automatic's other kernels.
  // small_cluster is add_lora_linear's shrink; every other kind that falls back to automatic's
  // choice below is a standalone shrink (auto_wg_band).
  const bool standalone = kind != K::small_cluster;
  if (kind == K::no_cluster || kind == K::cluster || kind == K::small_cluster) kind = K::automatic;
  const bool fused_ok = s.vec && s.dtype != DType::f32 && s.out_dtype == DType::f32;
  // 2. the warp-k tile inside the decode band (auto_wk_decode_band), ahead of
  // 3. the decode kernel (use_decode_kernel)
  if (kind == K::automatic && fused_ok && auto_wk_decode_band(s.T, s.S, s.R, lh)) kind = K::fused_wk;
  if (kind == K::automatic && use_decode_kernel(s.T, s.S, s.R, lh)) {
    p.path = ShrinkPath::decode;
    p.per_token = decode_per_token(s.T, s.L);
    return p;
  }
  // 4. one slice at rank <= 32 from 2048 tokens: the 128-token stream-K tile (auto_few_groups_sk)
  if (kind == K::automatic && auto_few_groups_sk(s.T, s.S, s.R)) kind = K::fused128_sk;
  const bool bm128 = kind == K::fused128_sk;
  const bool sk = kind == K::fused_sk || kind == K::fused128_sk;
  const bool as_auto = kind == K::automatic || kind == K::fused_wk || kind == K::fused_wg;
  // 5. the wgmma tile (auto_wg; standalone also auto_wg_band)
  const bool wg = fused_ok && d.wgmma &&
                  (kind == K::fused_wg ||
                   (kind == K::automatic &&
                    (auto_wg(s.T, s.S, s.R, lh) || (standalone && auto_wg_band(s.T, s.S, s.R, lh, s.K)))));
  // 6. the fused tile (auto_fused), with 7. the warp-k tile (auto_wk) where the wgmma tile is not taken
  const bool want_fused = kind == K::fused || kind == K::fused_nosplit || bm128 || sk || kind == K::fused_wk ||
                          kind == K::fused_wg || wg || (kind == K::automatic && auto_fused(s.T, s.S, s.R, lh));
  if (fused_ok && want_fused) {
    const bool wk = kind == K::fused_wk || (kind == K::automatic && !wg && auto_wk(s.T, s.K, s.S, s.R, d.num_sms, lh));
    p.path = ShrinkPath::fused;
    p.fused = fused_config(s.T, s.K, s.S, s.R, d.num_sms, kind != K::fused_nosplit, bm128 ? 128 : kFusedBM, sk,
                           as_auto, lh, wk, wg);
    if (p.fused.ksplit > 1 || p.fused.stream_k) p.zero = ShrinkZero::kernel;
    return p;
  }
  // 8. the legacy kernels: the mma tiles (use_mma) or the GEMV; y zeroed first, by the zero kernel
  // with the atomic GEMV as its programmatic dependent, except for `legacy` (a memset)
  const bool mma = use_mma(s.dtype, s.out_dtype, s.T);
  const bool atomic_gemv = s.out_dtype == DType::f32 && !mma;
  p.pdl = atomic_gemv && kind != K::legacy;
  p.zero = p.pdl ? ShrinkZero::kernel : ShrinkZero::memset;
  if (mma) {
    p.path = ShrinkPath::mma;
    p.mma = mma_config(s.T, s.K, s.S, s.R, d.num_sms);
    return p;
  }
  p.path = ShrinkPath::gemv;
  p.atomic = s.out_dtype == DType::f32;
  p.gemv = gemv_config(s.K, s.R, !p.atomic);
  return p;
}
}  // namespace shrink_heur

}  // namespace punica::kernels
