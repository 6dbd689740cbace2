// The host's choices for the bgmv MoE LoRA deltas (kernels/bgmv_moe_lora_delta): which path runs,
// the grouped path's tile height, the workspace each plan needs, and the argument checks. Static
// shapes only (T, k, E, L, rank, widths): no device value is read, so a call is graph capturable.
#pragma once
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include "kernels/bgmv_moe_lora_delta/bgmv_moe_lora_delta.h"
#include "kernels/moe_lora_align/moe_lora_align.h"

namespace punica::kernels {

// The grouped tile holds S x round_up(rank, 16) intermediate columns on chip (mma accumulators of
// 8 warps, 64 fp32 registers per thread at 64 pairs): up to 256.
constexpr int kBgmvGroupedMaxCols = 256;

namespace bgmv_detail {
inline int round16(int r) { return (r + 15) / 16 * 16; }
// Estimated pairs per (adapter, expert) group: the pairs spread over min(L, T) adapters x E experts.
inline double pairs_per_group(int64_t T, int k, int E, int L) {
  const double groups = double(std::max<int64_t>(1, std::min<int64_t>(std::max(L, 1), T))) * double(std::max(E, 1));
  return double(T) * double(k) / std::min(groups, double(std::max<int64_t>(T * k, 1)));
}
// The rule both ops share. The per-pair path reads each pair's A and B (from L2 when the pairs of a
// group repeat them), the grouped path each touched group's once but pays the alignment and a 16-row
// mma tile for every group: grouped from 2 pairs per group on average (decode batches stay on the
// per-pair path, whose grid spreads rank rows and column tiles over the SMs). Tile height: 16 pairs
// below 24 per group, 32 below 48, else 64 (fewer padded rows where groups are small).
// Grouped path's grid: the alignment blocks that hold pairs are at most one per bm pairs plus one
// partial block per (adapter, expert) group; a decode-sized batch has few of them (Mixtral T = 64:
// ~32), each with a long K (the shrink) and thousands of output columns (the expand). One block per
// alignment block walked both serially (1xH200, 4df5ced: Mixtral gemm1 T = 64 1075 µs against a
// 10.6 µs floor, T = 4096 1730 against 129), so both halves split over more blocks: the shrink's K
// over up to 2 waves of its 2-per-SM blocks (fp32 partials added atomically, each split >= 512 of
// K), the expand's column tiles over ~8 blocks per SM (they are latency bound: each holds a tile's
// stores and the next tile's B loads in flight).
constexpr int64_t kBgmvShrinkBlocks = 528;   // 2 waves of 2 blocks per SM (132 SMs)
constexpr int64_t kBgmvExpandBlocks = 1056;  // 8 per SM
constexpr int kBgmvExpandCols = 64;          // expand tile width (columns)
constexpr int64_t kBgmvMinSplitK = 512;
inline int64_t grouped_live_blocks(int64_t T, int k, int E, int L, int bm) {
  const int64_t P = T * k, groups = std::min<int64_t>(P, std::min<int64_t>(std::max(L, 1), T) * std::max(E, 1));
  return std::max<int64_t>(1, (P + bm - 1) / bm + groups);
}
inline BgmvMoePlan plan(int64_t T, int k, int E, int L, int S, int rank, int64_t K, int64_t N) {
  BgmvMoePlan p;
  const bool fits = S * round16(std::max(rank, 1)) <= kBgmvGroupedMaxCols && E <= kMoeAlignMaxExperts;
  const double ppg = pairs_per_group(T, k, E, L);
  if (!fits || T * k < 32 || ppg < 2.0) return p;
  p.path = BgmvMoePath::grouped;
  p.block_m = ppg < 24 ? 16 : ppg < 48 ? 32 : 64;
  const int64_t live = grouped_live_blocks(T, k, E, L, p.block_m);
  const int64_t ks_max = std::max<int64_t>(1, K / kBgmvMinSplitK);
  p.k_split = int(std::clamp<int64_t>((kBgmvShrinkBlocks + live - 1) / live, 1, ks_max));
  const int64_t tiles = int64_t(S) * ((N + kBgmvExpandCols - 1) / kBgmvExpandCols);
  p.col_split = int(std::clamp<int64_t>((kBgmvExpandBlocks + live - 1) / live, 1, std::max<int64_t>(tiles, 1)));
  return p;
}
inline std::size_t align256(std::size_t b) { return (b + 255) / 256 * 256; }
// Grouped buffers: moe_lora_align's aligned mode over the per-token slots, then the fp32
// intermediate u[pair, S * round16(rank)] the shrink writes (atomically with k_split > 1) and the
// expand reads (rounded to the LoRA dtype as it loads it).
struct GroupedLayout {
  int64_t P = 0, Q = 0;
  std::size_t sorted = 0, eids = 0, ntpp = 0, u = 0, align_ws = 0, end = 0;
};
inline GroupedLayout grouped_layout(int64_t T, int k, int E, int L, int bm, int sr_max) {
  GroupedLayout g;
  const auto sz = moe_lora_align_sizes(T * k, E, bm, false);
  g.P = sz.max_padded;
  g.Q = sz.max_blocks;
  g.sorted = 0;
  g.eids = align256(g.sorted + std::size_t(std::max(L, 1)) * std::size_t(std::max<int64_t>(g.P, 1)) * 4);
  g.ntpp = align256(g.eids + std::size_t(std::max(L, 1)) * std::size_t(std::max<int64_t>(g.Q, 1)) * 4);
  g.u = align256(g.ntpp + std::size_t(std::max(L, 1)) * 4);
  g.align_ws = align256(g.u + std::size_t(std::max<int64_t>(T * k, 1)) * std::size_t(std::max(sr_max, 1)) * 4);
  g.end = g.align_ws;  // + the alignment's own workspace (bgmv_moe_gemm*_workspace_bytes adds it)
  return g;
}
inline int gemm1_slices(const BgmvMoeGemm1Args& a) { return a.shared_a ? 1 : 2; }
inline int64_t gemm1_slice_width(const BgmvMoeGemm1Args& a) { return a.shared_a ? 2 * a.intermediate : a.intermediate; }
}  // namespace bgmv_detail

inline BgmvMoePlan plan_bgmv_moe_gemm1(const BgmvMoeGemm1Args& a) {
  return bgmv_detail::plan(a.num_tokens, a.top_k, a.num_experts, a.max_loras, bgmv_detail::gemm1_slices(a), a.rank,
                           a.hidden, bgmv_detail::gemm1_slice_width(a));
}
inline BgmvMoePlan plan_bgmv_moe_gemm2(const BgmvMoeGemm2Args& a) {
  return bgmv_detail::plan(a.num_tokens, a.top_k, a.num_experts, a.max_loras, 1, a.rank, a.intermediate, a.hidden);
}
inline std::string describe_plan_(const BgmvMoePlan& p, const char* op) {
  if (p.path == BgmvMoePath::pairs) return std::string(op) + " pairs (shrink per rank row -> column-tiled expand)";
  return std::string(op) + " grouped bm" + std::to_string(p.block_m) + " ks" + std::to_string(p.k_split) + " cs" +
         std::to_string(p.col_split) + " (align -> mma shrink -> mma expand)";
}
inline std::string describe_bgmv_moe_gemm1_plan(const BgmvMoeGemm1Args& a) {
  return describe_plan_(plan_bgmv_moe_gemm1(a), a.shared_a ? "gemm1 shared_a" : "gemm1 regular");
}
inline std::string describe_bgmv_moe_gemm2_plan(const BgmvMoeGemm2Args& a) {
  return describe_plan_(plan_bgmv_moe_gemm2(a), "gemm2");
}

namespace bgmv_detail {
template <class A>
std::string common_error(const A& a, int64_t in_width, int64_t out_width, const char* in_name, const char* out_name) {
  auto is16 = [](DType t) { return t == DType::f16 || t == DType::bf16; };
  if (!is16(a.lora_dtype)) return "lora_dtype: expected fp16 or bf16";
  if (!is16(a.out_dtype) && a.out_dtype != DType::f32) return "out_dtype: expected bf16, fp16 or fp32";
  if (a.num_tokens < 0) return "num_tokens: expected >= 0";
  if (a.top_k < 1) return "top_k: expected >= 1";
  if (in_width < 1) return std::string(in_name) + ": expected >= 1";
  if (out_width < 1) return std::string(out_name) + ": expected >= 1";
  if (a.num_experts < 1) return "num_experts: expected >= 1";
  if (a.max_loras < 1) return "max_loras: expected >= 1";
  if (a.rank < 1 || a.rank > kBgmvMoeMaxRank) return "rank: expected 1.." + std::to_string(kBgmvMoeMaxRank);
  if (a.lora_stride_a < 0 || a.lora_stride_b < 0) return "lora_stride: expected >= 0";
  if (a.num_tokens == 0) return "";
  if (!a.w_ptr_a || !a.w_ptr_b) return "w_ptr_a / w_ptr_b: expected pointer tables";
  if (!a.topk_ids || !a.lora_ids || !a.out) return "topk_ids / lora_ids / out: expected pointers";
  return "";
}
}  // namespace bgmv_detail

inline std::string bgmv_moe_gemm1_arg_error(const BgmvMoeGemm1Args& a) {
  std::string e = bgmv_detail::common_error(a, a.hidden, a.intermediate, "hidden", "intermediate");
  if (!e.empty() || a.num_tokens == 0) return e;
  if (!a.x) return "x: expected a pointer";
  if (a.ld_out != 0 && a.ld_out < 2 * a.intermediate) return "ld_out: expected >= 2 * intermediate";
  return "";
}
inline std::string bgmv_moe_gemm2_arg_error(const BgmvMoeGemm2Args& a) {
  std::string e = bgmv_detail::common_error(a, a.intermediate, a.hidden, "intermediate", "hidden");
  if (!e.empty() || a.num_tokens == 0) return e;
  if (!a.act || !a.perm || !a.topk_weights) return "act / perm / topk_weights: expected pointers";
  if (a.act_rows < 1) return "act_rows: expected >= 1";
  if (a.ld_out != 0 && a.ld_out < a.hidden) return "ld_out: expected >= hidden";
  return "";
}

}  // namespace punica::kernels
