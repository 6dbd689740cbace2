// Host-side path choice of add_lora_linear: decode-sized batches run the decode shrink kernel into
// the fp32 [S,T,r] workspace (every element written, no memset) chained by programmatic dependent
// launch into the decode expand; larger batches run shrink -> expand through the same buffer.
#pragma once
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include "kernels/add_lora_linear/add_lora_linear_internal.h"
#include "kernels/lora_expand/heuristics.h"
#include "kernels/lora_shrink/heuristics.h"

namespace punica::kernels::linear_heur {

constexpr int64_t kDecodeMaxTokens = 128;

inline bool use_partials(int64_t T) { return T <= kDecodeMaxTokens; }
// Within decode: the older split-K partials GEMV -> PDL wide-N expand stays faster for T >= 64 with
// 4..16 tokens per adapter when r <= 16, K >= 8192, S >= 3 or the output is wider than 8192 columns
// (H200, T=64, 8 adapters: H=8192 r=64 37.3 vs 46.1 us; qkv r=16 16.6 vs 18.1 us; Llama-3-8B gate_up
// N=2x14336 ranks 8/16/64: 62.7 vs 103.2 us, its tp=2 shard 2x7168: 36.4 vs 56.3 us, because the
// decode expand re-reads B for every token); otherwise the decode shrink -> decode expand wins (one
// slice H=4096 r=64, 8 adapters: 25.8 vs 32.5 us; 1 or 32 adapters: up to 4x).
inline bool use_split_partials(int64_t T, int max_loras, int max_rank, int64_t K, int S, int64_t total_n) {
  const bool mid = T >= 64 && T >= 4 * int64_t(max_loras) && T <= 16 * int64_t(max_loras);
  return mid && (max_rank <= 16 || K >= 8192 || S >= 3 || total_n > 8192);
}

// Within decode, several tokens per adapter (T / max_loras): the shrink -> mma expand (tiles)
// instead of the decode kernels, whose expand re-reads B for every token; checked before the
// partials rule. Measured on the H200 (LoraPerf, results/NOTES.md v8, cold): one slice H=8192
// r=64, T=64, 8 adapters: 28.7 us against 50.0 (decode) and 60.1 (partials, then automatic);
// qkv r=64, 1 adapter, T=16: 16.3 against 17.9; one slice r=16, T=64, 8 adapters: 12.7 against
// 14.9; r=16 below 8 tokens per adapter stays with the decode kernels (T=32, 8 adapters: 12.6
// against 11.6). The rule is the expand's own small-batch rule. Its 2-tokens-per-adapter case above
// rank 16 (T >= 64) was kept on the decode kernels in v8 (H=8192 r=64, T=64, 32 adapters: 62.6
// against 56.9 cold), before the PDL decode chain and the streaming expand's small-batch rule;
// re-measured in v13 (bench A/B, 3 interleaved rounds, results/NOTES.md v13 part 4, back to back)
// it is faster with the tiles: H=8192 50.6 -> 46.5 us, qkv 52.6 -> 49.1, H=4096 within 2%.
inline bool use_tiles(int64_t T, int max_loras, int max_rank) {
  if (T > kDecodeMaxTokens) return true;
  return expand_heur::small_batch_mma(T, max_loras, max_rank);
}

// Decode-sized batches that the cluster shrink takes (shrink_heur::auto_cluster_small), at rank <= 16
// or with >= 32 tokens per adapter: the expand (the after-shrink choice) as the cluster shrink's
// programmatic dependent, so that the expand's y and B loads overlap the shrink. It loads y before
// its griddepcontrol.wait, so it may launch only once the kernel before the shrink has finished:
// the shrink's CTAs trigger it only after their own wait (launch_shrink_cluster's late_trigger; an
// ordinary launch of the shrink until v25). Otherwise both are programmatic dependents that
// trigger at once and wait before touching x or y. Late trigger against the ordinary launch (bench
// A/B, results/NOTES.md v25 part 2, back to back, T=64): qkv r=16 one adapter 8.59 -> 5.56 us, one
// slice r=64 one adapter 10.07 -> 6.85, qkv r=64 11.88 -> 8.96; both dependents without the swap
// gained less (8.59 -> 6.45, 10.07 -> 8.43). The v20 rule, measured on the H200
// (bench_lora_ops, T=32-512 by axis override, exp/linear-small-pdl against b0cf3f6, 2 interleaved
// rounds each; results/NOTES.md v20 part 4): add_lora_linear 0.73-0.96 of the time back to back (one
// slice r=64, one adapter, T=32: 10.50 -> 7.68 us; qkv r=64 T=128 15.65 -> 13.61); with 8 adapters of
// rank 64 at T=128 (16 tokens each) it was 1.12x slower (the after-shrink choice is then the
// pipelined r <= 64 kernel), hence the tokens-per-adapter clause.
constexpr int64_t kPdlExpandMinTokensPerLora = 32;
inline bool small_cluster_pdl_expand(int64_t T, int S, int max_rank, int64_t max_loras) {
  return shrink_heur::auto_cluster_small(T, S, max_rank, max_loras) &&
         (max_rank <= 16 || T >= kPdlExpandMinTokensPerLora * std::max<int64_t>(1, max_loras));
}

// Mid-sized batches of at most 2 blocks of 8 rank columns (one slice, rank <= 16), where
// lora_shrink's automatic choice is the cluster tile: add_lora_linear takes it too, as a
// programmatic dependent with late trigger (launch_shrink_cluster), before the expand's programmatic
// launch, for 129-256 tokens, and up to 1024 tokens at hidden sizes up to 4096. Bench A/Bs against
// the fused atomic path (results/NOTES.md v25 parts 2 and 4, 3 interleaved rounds, back to back /
// cold): T=256 one adapter H=4096 9.22 -> 6.58 us (0.71) / 1.02, 8 adapters 0.71 / 0.98, 32
// adapters 0.88 / 0.94, H=8192 0.85-0.97 / 0.92-0.97; H=4096 T=512 0.84-0.92 / 0.95-1.03, T=1024
// 0.93-0.97 / 0.91-0.97. Not at H=4096 T=2048 (1.02-1.07 back to back), nor at H=8192 from 512
// tokens (0.95-1.04 at T=512, 1.04-1.10 at T=1024, 1.18-1.26 at T=2048). Not for qkv at rank 16
// (6 blocks, which lora_shrink's rule also takes): 0.95 back to back but 1.05-1.14x cold at T=256.
constexpr int64_t kMidClusterMaxTokens = 256;
constexpr int64_t kMidClusterNarrowKMaxTokens = 1024;
constexpr int64_t kMidClusterNarrowMaxK = 4096;
constexpr int kMidClusterMaxBlocks = 2;
inline bool mid_cluster(int64_t T, int S, int max_rank, int64_t max_loras, int64_t K) {
  const int64_t max_t = K <= kMidClusterNarrowMaxK ? kMidClusterNarrowKMaxTokens : kMidClusterMaxTokens;
  return T > kDecodeMaxTokens && T <= max_t && shrink_heur::cluster_blocks(S, max_rank) <= kMidClusterMaxBlocks &&
         shrink_heur::auto_cluster(T, S, max_rank, max_loras);
}

inline std::size_t workspace_bytes(int64_t max_tokens, int S, int R) {
  const std::size_t full = std::size_t(S) * std::size_t(std::max<int64_t>(max_tokens, 0)) * R * 4;
  const std::size_t part = std::size_t(shrink_heur::kMaxSplits) * S *
                           std::size_t(std::min<int64_t>(std::max<int64_t>(max_tokens, 0), kDecodeMaxTokens)) * R * 4;
  return std::max(full, part);
}

}  // namespace punica::kernels::linear_heur

namespace punica::kernels {

// ---------------------------------------------------------------- the plan
// Which chain of kernels one call runs (linear_heur::plan_chain) and the plans of its shrink and
// expand (add_lora_linear_plan). The chain's shrink and expand are the ops' own launches, which
// run the sub-plans recorded here. Paths (detail::LinearPath): decode and partials are taken by the
// automatic choice for small batches, tiles for the rest; all kept.
enum class LinearChain {
  none,          // nothing to do (T = 0 or no slots)
  partials,      // split-K GEMV partials -> (PDL) the wide-N GEMV expand (T <= 128)
  decode,        // the decode shrink -> (PDL) the decode expand (T <= 128)
  cluster,       // the cluster shrink (late trigger) -> (PDL) the expand after the shrink
  tiles,         // lora_shrink's small_cluster choice -> (PDL) the expand after the shrink (T > 128)
  small_tiles    // lora_shrink's small_cluster choice -> lora_expand's standalone launch (T <= 128)
};
struct LinearShape {
  int64_t T = 0, K = 0, total_n = 0;
  int S = 1, R = 0, L = 0;
  int planned = 0;          // planned_loras(L, num_active_loras)
  bool cluster_ok = false;  // the cluster tile can take the shrink (dtypes, alignment, ranks, device)
};

namespace linear_heur {
// The rules in order (heuristics_test pins them).
inline LinearChain plan_chain(const LinearShape& s, detail::LinearPath path) {
  using P = detail::LinearPath;
  if (s.T == 0 || s.L == 0) return LinearChain::none;
  const int lh = s.planned;
  const bool small = use_partials(s.T);
  if (!small && (path == P::decode || path == P::partials)) path = P::automatic;
  const bool auto_tiles = use_tiles(s.T, lh, s.R);
  if (path == P::automatic) {
    if (auto_tiles) path = P::tiles;
    else if (use_split_partials(s.T, lh, s.R, s.K, s.S, s.total_n)) path = P::partials;
    else path = P::decode;
  }
  if (path == P::partials) return LinearChain::partials;
  if (path == P::decode) return LinearChain::decode;
  if ((small ? auto_tiles && small_cluster_pdl_expand(s.T, s.S, s.R, lh) : mid_cluster(s.T, s.S, s.R, lh, s.K)) &&
      s.cluster_ok)
    return LinearChain::cluster;
  return small ? LinearChain::small_tiles : LinearChain::tiles;
}
}  // namespace linear_heur

struct LinearPlan {
  LinearChain chain = LinearChain::none;
  ShrinkPlan shrink;  // the shrink's plan (partials: unused, see nsplit)
  ExpandPlan expand;  // the expand's plan (partials: unused)
  ExpandPrefillKernel expand_kind = ExpandPrefillKernel::automatic;  // small_tiles: the expand's kind
  int nsplit = 0;     // partials: the GEMV's splits of K
};

}  // namespace punica::kernels
