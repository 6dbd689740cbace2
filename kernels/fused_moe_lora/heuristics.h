// Host-side choice of the fused MoE LoRA kernels (vLLM fused_moe_lora's split form: shrink into the
// [S, M, k, r] intermediate, then the expand): CUDA-core kernels (a warp per rank row, a thread per
// output column) or tensor-core tiles (mma.sync m16n8k16 over 16 pairs of one slot and expert).
// Decided from static shapes and dtypes only, so every launch stays graph capturable.
#pragma once
#include <algorithm>
#include <cstdint>
#include <string>
#include "kernels/fused_moe_lora/fused_moe_lora.h"

namespace punica::kernels::moe_heur {

constexpr int kMmaMaxEntries = 128;     // slot entries the mma kernels' packed work list holds
constexpr int kMmaMaxRank = 64;         // rank (shrink: a_rank, expand: max_rank) of the mma tiles
constexpr int kExpandCols = 128;        // mma expand: columns per tile
constexpr int64_t kMmaRows = 16;        // pairs per mma tile
constexpr int kExpandMaxTiles = 8;      // mma expand: column tiles one block walks at most
constexpr int64_t kMmaMinPairs = 4;     // mma shrink: average pairs per work item at least
constexpr int64_t kExpandBlocks = 2112; // mma expand: blocks aimed at (16 per SM), tiles per block above
// Split-K mma shrink (the one call with its scratch): K split over blocks of one work item, the
// parts' fp32 sums in the scratch, the item's last block (a ticket) adds them in order and rounds.
constexpr int64_t kSplitBlocks = 528;   // blocks aimed at: 132 SMs x 4 (the shrink's occupancy)
constexpr int64_t kSplitMinK = 512;     // K elements per part at least (4 32-wide chunks per warp)
constexpr int64_t kSplitSlots = 8192;   // parts x pairs the scratch holds (its size: S x r x 4 B per slot)
constexpr int kSplitMax = 16;           // parts per item at most

enum class Kernel { fused, rows, mma };  // fused: one kernel (no scratch); rows: CUDA cores; mma: tensor cores

struct Plan {
  Kernel shrink = Kernel::fused, expand = Kernel::fused;
  int64_t items = 0;       // mma: work-item slots of the grid (alignment blocks or naive pairs)
  int tiles_per_block = 1; // mma expand
  int items_per_block = 1; // mma expand: consecutive items sharing each B tile (block_size <= 16)
  int ksplit = 1;          // mma shrink: K parts per work item (blocks), > 1 only with the scratch
  std::string name() const {
    auto n = [](Kernel k) { return k == Kernel::mma ? "mma" : k == Kernel::rows ? "rows" : "fused"; };
    if (shrink == Kernel::fused) return "fused";
    return std::string("shrink=") + n(shrink) + (ksplit > 1 ? "/k" + std::to_string(ksplit) : "") + " expand=" + n(expand);
  }
};

// K parts the split-K scratch holds per pair for `numel` pairs (1 = no split-K region).
inline int split_max_parts(int64_t numel) {
  return int(std::clamp<int64_t>(kSplitSlots / std::max<int64_t>(numel, 1), 1, kSplitMax));
}

// Slot entries a plan counts: L + 1 (lora_ids' length; without it the kernels walk L entries), so
// the plan does not depend on whether a pointer is set.
inline int64_t entries(const FusedMoeLoraArgs& a) { return int64_t(a.max_loras) + 1; }

// Work items of a grid: naive, one per pair; aligned, at most one block per (entry, alignment block)
// and never more than the pairs' blocks plus one partial block per (entry, expert).
inline int64_t work_items(const FusedMoeLoraArgs& a) {
  const int64_t numel = a.num_tokens * a.top_k;
  if (a.routing.naive) return numel;
  const int64_t bs = std::max(1, a.routing.block_size);
  const int64_t Q = (a.routing.max_padded + bs - 1) / bs;
  const int64_t ent = entries(a);
  return std::max<int64_t>(0, std::min(ent * Q, (numel + bs - 1) / bs + std::min(numel, ent * a.num_experts)));
}

// `split`: the split form runs (the split API, or the one call with its scratch). `scratch`: the one
// call's scratch (fused_moe_lora_workspace_bytes) holds the split-K parts; the split API has only
// its intermediate, so there the shrink keeps one block per item. The kernels fall back to rows
// where a pointer is not 16-byte aligned (never in vLLM's or the suite's buffers).
inline Plan plan(const FusedMoeLoraArgs& a, bool split, bool scratch = true) {
  Plan p;
  if (!split) return p;
  p.shrink = p.expand = Kernel::rows;
  const bool b16 = a.dtype == DType::bf16 || a.dtype == DType::f16;
  const int rA = a.a_rank > 0 ? a.a_rank : a.max_rank;
  const int64_t numel = a.num_tokens * a.top_k;
  const bool list_ok = a.routing.naive || entries(a) <= kMmaMaxEntries;
  p.items = work_items(a);
  // Aligned routing only: a naive pair fills one row of a 16-row tile, the CUDA-core kernels as good.
  // Without split-K the shrink where items average >= kMmaMinPairs pairs (A read once per 16 rows);
  // with fewer, the row split spreads each item's rank rows and K over more SMs. With the scratch,
  // every aligned case: K split over up to kSplitMax blocks per item until the grid has
  // kSplitBlocks, >= kSplitMinK of K each (before, one block walked all of K: Mixtral w2 T=512 r16
  // 212 µs against a 15 µs floor; the row shrink at T=16-64, 39-124 µs against 3-6).
  const bool mma_ok = !a.routing.naive && b16 && list_ok && a.hidden % 8 == 0 && rA <= kMmaMaxRank;
  const bool splitk = mma_ok && scratch && rA == a.max_rank && a.a_rank_offset == 0;
  if (mma_ok && (splitk || numel >= kMmaMinPairs * p.items)) p.shrink = Kernel::mma;
  if (splitk && p.items > 0) {
    const int64_t grid = p.items * a.num_slices;
    const int64_t want = (kSplitBlocks + grid - 1) / grid;
    const int64_t kcap = std::max<int64_t>(1, a.hidden / kSplitMinK);
    p.ksplit = int(std::clamp<int64_t>(want, 1, std::min<int64_t>(kcap, split_max_parts(numel))));
  }
  // The expand wherever the intermediate is in the output dtype (an mma operand) and 16-byte rows.
  if (!a.routing.naive && b16 && list_ok && a.inter_dtype() == a.dtype && a.max_rank % 8 == 0 &&
      a.max_rank <= kMmaMaxRank) {
    p.expand = Kernel::mma;
    // Blocks of <= 16 pairs: 4 items per block share each B tile (2 at rank 33-64: registers), where a
    // (slot, expert) run averages >= 2 blocks. 5f696af against 89afcfc: Mixtral T=4096 (205 pairs per
    // run) w13 600 -> 497 µs; Qwen / DeepSeek w2 T=512 (6-10 pairs, one block per run) 57.5 -> 68.2,
    // 57.6 -> 63.4: nothing to share, the items' epilogues only serialise.
    if (a.routing.block_size <= 16 && numel >= 2 * kMmaRows * entries(a) * a.num_experts)
      p.items_per_block = a.max_rank > 32 ? 2 : 4;
    const int64_t tiles = (a.slice_width + kExpandCols - 1) / kExpandCols;
    const int64_t blocks = std::max<int64_t>(1, std::min(numel, p.items) / p.items_per_block) * a.num_slices * tiles;
    p.tiles_per_block = int(std::clamp<int64_t>(blocks / kExpandBlocks, 1, kExpandMaxTiles));
  }
  return p;
}

}  // namespace punica::kernels::moe_heur
