// Launch heuristics of the LoRA kernels, checked on the host (no GPU needed): the dispatch rules
// that results/NOTES.md justifies with H200 measurements. A change to a rule must change a
// number here on purpose.
#include <gtest/gtest.h>
#include <string>
#include <vector>
#include "kernels/common/error.h"
#include "kernels/common/lora_types.h"
#include "kernels/add_lora_linear/add_lora_linear.h"
#include "kernels/lora_expand/lora_expand.h"
#include "kernels/lora_shrink/lora_shrink.h"
#include "kernels/add_lora_linear/heuristics.h"
#include "kernels/lora_expand/heuristics.h"
#include "kernels/lora_expand/lora_expand_internal.h"
#include "kernels/lora_shrink/heuristics.h"
#include "kernels/fused_moe_lora/heuristics.h"
#include "kernels/bgmv_moe_lora_delta/bgmv_moe_lora_delta.h"

namespace punica::kernels {
namespace {

// num_active_loras (the caller's hint) replaces max_loras in the launch rules only when it is
// given and smaller; the grids then cover its entries plus the -1 entry.
TEST(LoraTypes, PlannedLoras) {
  EXPECT_EQ(planned_loras(32, 0), 32);   // not given: every slot
  EXPECT_EQ(planned_loras(32, 1), 1);
  EXPECT_EQ(planned_loras(32, 8), 8);
  EXPECT_EQ(planned_loras(32, 32), 32);
  EXPECT_EQ(planned_loras(32, 40), 32);  // never more than the slots
  EXPECT_EQ(planned_loras(32, -3), 32);
  EXPECT_EQ(planned_loras(0, 4), 0);
}

// A negative num_active_loras is a usage error of each op that takes it, raised before any CUDA call
// (so this runs without a GPU).
TEST(LoraTypes, NegativeActiveLorasIsAUsageError) {
  auto usage = [](auto&& launch) {
    try {
      launch();
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::usage) << e.what();
      EXPECT_NE(std::string(e.what()).find("num_active_loras must be >= 0"), std::string::npos) << e.what();
      return;
    }
    ADD_FAILURE() << "no usage error";
  };
  LoraShrinkArgs s;
  s.num_tokens = 1; s.hidden = 64; s.max_loras = 2; s.max_rank = 16; s.num_active_loras = -1;
  usage([&] { launch_lora_shrink(s, nullptr); });
  LoraExpandArgs e;
  e.num_tokens = 1; e.slice_width[0] = 64; e.max_loras = 2; e.max_rank = 16; e.num_active_loras = -1;
  usage([&] { launch_lora_expand(e, nullptr); });
  AddLoraLinearArgs l;
  l.num_tokens = 1; l.hidden = 64; l.slice_width[0] = 64; l.max_loras = 2; l.max_rank = 16; l.num_active_loras = -1;
  usage([&] { launch_add_lora_linear(l, nullptr); });
}

TEST(ShrinkHeuristics, FusedSplitTargetsTheBlocksThatFit) {
  // qkv r=64 (3 column groups per warp, 96 KB of stages): 2 blocks per SM fit, so K splits 3 ways
  // (aiming at 3 per SM, 4 ways, measured 11% slower: NOTES v4).
  const auto qkv64 = shrink_heur::fused_config(8192, 4096, 3, 64, 132);
  EXPECT_EQ(qkv64.ngw, 3);
  EXPECT_EQ(qkv64.ksplit, 3);
  // One slice r=64 (64 KB of stages): 3 blocks per SM fit above a wave of tiles -> 4-way split.
  const auto one64 = shrink_heur::fused_config(8192, 4096, 1, 64, 132);
  EXPECT_EQ(one64.ngw, 1);
  EXPECT_EQ(one64.ksplit, 4);
  // Under 0.9 wave of token tiles (T=2048: 32 tiles): ~2 blocks per SM.
  EXPECT_EQ(shrink_heur::fused_config(2048, 4096, 1, 64, 132).ksplit, 8);
  // Up to 256 tokens with one group per warp: up to 32 splits of >= 2 k-tiles (NOTES v27); not
  // with 3 groups per warp (qkv r=64), nor above 256 tokens.
  EXPECT_EQ(shrink_heur::fused_config(256, 4096, 1, 64, 132).ksplit, 32);
  EXPECT_EQ(shrink_heur::fused_config(256, 8192, 1, 64, 132).ksplit, 32);
  EXPECT_EQ(shrink_heur::fused_config(256, 4096, 3, 16, 132).ksplit, 32);
  EXPECT_EQ(shrink_heur::fused_config(256, 4096, 3, 64, 132).ksplit, 16);
  EXPECT_EQ(shrink_heur::fused_config(512, 4096, 1, 64, 132).ksplit, 16);
  // Split-K off on request: every y element written by the kernel.
  EXPECT_EQ(shrink_heur::fused_config(2048, 4096, 1, 64, 132, false).ksplit, 1);
  // 128-token tiles (ShrinkKernel::fused128_sk): qkv r=16 = 3 groups -> 2 per warp,
  // 96 KB of stages (2 blocks per SM); more than 6 groups falls back to 64-token tiles.
  const auto q128 = shrink_heur::fused_config(8192, 4096, 3, 16, 132, true, 128);
  EXPECT_EQ(q128.bm, 128);
  EXPECT_EQ(q128.ngw, 2);
  EXPECT_EQ(q128.smem, std::size_t(4) * (128 * 128 + 2 * 2 * 16 * 128));
  EXPECT_EQ(shrink_heur::fused_config(8192, 4096, 3, 64, 132, true, 128).bm, 64);
  EXPECT_EQ(shrink_heur::fused_config(8192, 4096, 3, 32, 132, true, 128).ngw, 3);
}

// The wgmma tile (NOTES v10): N = 16 * S * ceil(R/16) of 32, 48, 64 or 192, at least 256 tokens per
// adapter; N = 192 from T=512, N = 32/48 from T=4096, N = 64 up to T=1024.
TEST(ShrinkHeuristics, WgmmaTile) {
  EXPECT_TRUE(shrink_heur::auto_wg(8192, 3, 16, 8));    // qkv r=16 (N = 48)
  EXPECT_TRUE(shrink_heur::auto_wg(8192, 2, 16, 8));    // gate_up r=16 (N = 32)
  EXPECT_TRUE(shrink_heur::auto_wg(8192, 3, 64, 32));   // qkv r=64 (N = 192), 256 tokens per adapter
  EXPECT_TRUE(shrink_heur::auto_wg(512, 3, 64, 1));
  EXPECT_FALSE(shrink_heur::auto_wg(256, 3, 64, 1));    // N = 192 below T=512
  EXPECT_TRUE(shrink_heur::auto_wg(1024, 1, 64, 1));    // N = 64
  EXPECT_FALSE(shrink_heur::auto_wg(8192, 1, 64, 8));   // N = 64 at T=8192: the warp-k tile
  EXPECT_FALSE(shrink_heur::auto_wg(4096, 3, 64, 32));  // 128 tokens per adapter
  EXPECT_FALSE(shrink_heur::auto_wg(2048, 3, 16, 8));   // N = 48 below T=4096
  // 512-1024 tokens with >= 64 tokens per adapter: N = 48 and N = 64 (NOTES v21)
  EXPECT_TRUE(shrink_heur::auto_wg(512, 3, 16, 8));
  EXPECT_TRUE(shrink_heur::auto_wg(1024, 3, 16, 1));
  EXPECT_TRUE(shrink_heur::auto_wg(1024, 1, 64, 8));
  EXPECT_TRUE(shrink_heur::auto_wg(512, 1, 64, 8));
  EXPECT_FALSE(shrink_heur::auto_wg(1024, 1, 64, 32));  // 32 tokens per adapter
  EXPECT_FALSE(shrink_heur::auto_wg(1024, 3, 16, 32));
  EXPECT_FALSE(shrink_heur::auto_wg(256, 3, 16, 1));    // T=256: slower in a graph
  EXPECT_FALSE(shrink_heur::auto_wg(2048, 1, 64, 8));   // the mid-batch rule ends at 1024 tokens
  EXPECT_FALSE(shrink_heur::auto_wg(8192, 1, 16, 8));   // N = 16: no wgmma tile
  EXPECT_FALSE(shrink_heur::auto_wg(8192, 3, 32, 8));   // N = 96: no wgmma tile
  EXPECT_EQ(shrink_heur::wg_columns(3, 13), 48);
  const auto c = shrink_heur::fused_config(8192, 4096, 3, 16, 132, true, shrink_heur::kFusedBM, false, true, 8, false, true);
  EXPECT_EQ(c.wg_n, 48);
  EXPECT_EQ(c.bm, 128);
  EXPECT_TRUE(c.stream_k);  // 64 tiles x 64 k-tiles >= 8 per slot over 264 slots
  EXPECT_EQ(c.smem, std::size_t(4) * (128 * 128 + 48 * 128) + 1024);
  const auto b = shrink_heur::fused_config(8192, 4096, 3, 64, 132, true, shrink_heur::kFusedBM, false, true, 8, false, true);
  EXPECT_EQ(b.wg_n, 192);
  EXPECT_EQ(b.sk_blocks, 132);  // one block per SM
}

// Between auto_wg's ranges, for a standalone shrink (NOTES v35, v37): N = 64 from 1025 to 3072 tokens (to
// 4096 where K <= 4096), N = 48 from 1536 to 4095, each with at least 256 tokens per adapter.
TEST(ShrinkHeuristics, WgmmaBand) {
  EXPECT_TRUE(shrink_heur::auto_wg_band(1025, 1, 64, 4, 8192));   // one slice r=64 (N = 64)
  EXPECT_TRUE(shrink_heur::auto_wg_band(2048, 1, 64, 8, 8192));
  EXPECT_TRUE(shrink_heur::auto_wg_band(3072, 1, 49, 1, 8192));   // N = 64 by the padded rank
  EXPECT_FALSE(shrink_heur::auto_wg_band(1024, 1, 64, 1, 8192));  // auto_wg's own range
  EXPECT_FALSE(shrink_heur::auto_wg_band(3073, 1, 64, 1, 8192));  // T=4096 at H=8192 did not gain
  EXPECT_FALSE(shrink_heur::auto_wg_band(2048, 1, 64, 32, 8192)); // 64 tokens per adapter
  EXPECT_TRUE(shrink_heur::auto_wg_band(1536, 3, 16, 1, 8192));   // qkv r=16 (N = 48)
  EXPECT_TRUE(shrink_heur::auto_wg_band(4095, 3, 16, 8, 8192));
  EXPECT_FALSE(shrink_heur::auto_wg_band(1535, 3, 16, 1, 8192));
  EXPECT_FALSE(shrink_heur::auto_wg_band(4096, 3, 16, 8, 8192));  // auto_wg's own range from 4096
  EXPECT_FALSE(shrink_heur::auto_wg_band(2047, 3, 16, 8, 8192));  // under 256 tokens per adapter
  EXPECT_FALSE(shrink_heur::auto_wg_band(2048, 2, 16, 1, 8192));  // N = 32 (gate_up): not measured
  EXPECT_FALSE(shrink_heur::auto_wg_band(2048, 3, 64, 1, 8192));  // N = 192: auto_wg from 512
  EXPECT_FALSE(shrink_heur::auto_wg_band(2048, 1, 16, 1, 8192));  // N = 16: no wgmma tile
  // K <= 4096: the N = 64 band runs to 4096 tokens (NOTES v37)
  EXPECT_TRUE(shrink_heur::auto_wg_band(3073, 1, 64, 1, 4096));
  EXPECT_TRUE(shrink_heur::auto_wg_band(4096, 1, 64, 8, 4096));
  EXPECT_TRUE(shrink_heur::auto_wg_band(4096, 1, 64, 16, 2056));
  EXPECT_FALSE(shrink_heur::auto_wg_band(4097, 1, 64, 1, 4096));
  EXPECT_FALSE(shrink_heur::auto_wg_band(4096, 1, 64, 1, 4104));  // K past 4096
  EXPECT_FALSE(shrink_heur::auto_wg_band(4096, 1, 64, 32, 4096)); // 128 tokens per adapter
  EXPECT_FALSE(shrink_heur::auto_wg_band(4096, 3, 16, 1, 4096));  // N = 48 keeps its range
  // the two rules do not overlap
  for (int64_t T : {1025, 2048, 3072})
    EXPECT_FALSE(shrink_heur::auto_wg(T, 1, 64, 1)) << T;
  for (int64_t T : {1536, 2048, 4095})
    EXPECT_FALSE(shrink_heur::auto_wg(T, 3, 16, 1)) << T;
}

// The wgmma tile's split-K fits one wave (results/NOTES.md v37): tiles x splits <= 2 blocks per SM,
// counting each adapter's tokens as starting a tile (an even split over the planned adapters), over
// the token counts where rounding the split up spilled at K=4096 (T=2049-2176, 2561-2688, 3073-3712)
// and the band's ends; every split non-empty and the splits covering K.
TEST(ShrinkHeuristics, WgmmaSplitOneWave) {
  const int sms = 132;
  const int64_t slots = 2 * sms;  // N <= 64: 2 blocks per SM
  for (int64_t K : {2056, 4096, 8192})
    for (int64_t L : {1, 2, 8})
      for (int64_t T = 1025; T <= 4096; T += (T >= 2049 && T <= 3712) ? 1 : 31)
        for (auto [S, r] : {std::pair{1, 64}, std::pair{3, 16}}) {
          const auto c = shrink_heur::fused_config(T, K, S, r, sms, true, shrink_heur::kFusedBM, false, true, L,
                                                   false, true);
          ASSERT_GT(c.wg_n, 0);
          if (c.stream_k) continue;  // one block per slot by construction
          const int64_t ktiles = (K + 63) / 64, per = (T + L - 1) / L;
          const int64_t tiles = std::max((T + 127) / 128, L * ((per + 127) / 128));
          ASSERT_LE(tiles * c.ksplit, slots) << "T=" << T << " K=" << K << " L=" << L << " S=" << S;
          ASSERT_GE(int64_t(c.ksplit) * c.ktiles_per_split, ktiles) << "T=" << T << " K=" << K;
          ASSERT_LT(int64_t(c.ksplit - 1) * c.ktiles_per_split, ktiles) << "T=" << T << " K=" << K;
        }
  // T=3328 at K=4096, one adapter: 26 tiles x 10 splits of 7 k-tiles (rounding up made 11: 286 blocks)
  const auto c = shrink_heur::fused_config(3328, 4096, 1, 64, sms, true, shrink_heur::kFusedBM, false, true, 1,
                                           false, true);
  EXPECT_EQ(c.ksplit, 10);
  EXPECT_EQ(c.ktiles_per_split, 7);
  // ... and with 8 adapters of 416 tokens: 32 tiles x 8 splits
  EXPECT_EQ(shrink_heur::fused_config(3328, 4096, 1, 64, sms, true, shrink_heur::kFusedBM, false, true, 8, false,
                                      true).ksplit, 8);
}

// The warp-k tile (NOTES v9): automatic for 2-4 column groups with stream-K's long ranges (2 blocks
// per SM, 112 KB of stages); never for one group, 12 groups or T=2048.
TEST(ShrinkHeuristics, WarpKTile) {
  EXPECT_TRUE(shrink_heur::auto_wk(8192, 4096, 3, 16, 132, 8));   // qkv r=16
  EXPECT_TRUE(shrink_heur::auto_wk(8192, 4096, 2, 16, 132, 8));   // gate_up r=16
  EXPECT_TRUE(shrink_heur::auto_wk(8192, 4096, 1, 64, 132, 8));
  EXPECT_FALSE(shrink_heur::auto_wk(8192, 8192, 1, 16, 132, 8));  // one group
  EXPECT_FALSE(shrink_heur::auto_wk(8192, 4096, 3, 64, 132, 8));  // 12 groups
  EXPECT_FALSE(shrink_heur::auto_wk(2048, 4096, 3, 16, 132, 8));
  // 256-1024 tokens with >= 32 adapters and 3-4 groups (NOTES v21)
  EXPECT_TRUE(shrink_heur::auto_wk(256, 4096, 1, 64, 132, 32));
  EXPECT_TRUE(shrink_heur::auto_wk(1024, 4096, 3, 16, 132, 32));
  EXPECT_TRUE(shrink_heur::auto_wk(512, 8192, 1, 64, 132, 32));
  EXPECT_FALSE(shrink_heur::auto_wk(256, 4096, 3, 16, 132, 8));   // 8 adapters
  EXPECT_FALSE(shrink_heur::auto_wk(2048, 4096, 1, 64, 132, 32)); // past 1024 tokens
  EXPECT_FALSE(shrink_heur::auto_wk(512, 4096, 2, 16, 132, 32));  // 2 groups
  EXPECT_FALSE(shrink_heur::auto_wk(512, 4096, 3, 64, 132, 32));  // 12 groups: does not fit
  const auto c = shrink_heur::fused_config(8192, 4096, 3, 16, 132, true, shrink_heur::kFusedBM, false, true, 8, true);
  EXPECT_TRUE(c.wk);
  EXPECT_TRUE(c.stream_k);
  EXPECT_EQ(c.sk_blocks, 2 * 132);
  EXPECT_EQ(c.smem, std::size_t(7) * (64 * 128 + 4 * 16 * 128));
  EXPECT_FALSE(shrink_heur::fused_config(8192, 4096, 3, 64, 132, true, shrink_heur::kFusedBM, false, true, 8, true).wk);
}

// Stream-K on the automatic path from >= 16 k-tiles per resident block (NOTES v6): T=8192 H=4096
// (128 tiles x 64 k-tiles over 396 or 264 slots) yes, T=2048 or T=4096 with 2 blocks per SM no.
TEST(ShrinkHeuristics, StreamKFromLongRanges) {
  const auto q16 = shrink_heur::fused_config(8192, 4096, 3, 16, 132, true, shrink_heur::kFusedBM, false, true);
  EXPECT_TRUE(q16.stream_k);
  EXPECT_EQ(q16.sk_blocks, 3 * 132);  // 64 KB of stages: 3 blocks per SM
  const auto q64 = shrink_heur::fused_config(8192, 4096, 3, 64, 132, true, shrink_heur::kFusedBM, false, true);
  EXPECT_TRUE(q64.stream_k);
  EXPECT_EQ(q64.sk_blocks, 2 * 132);
  EXPECT_FALSE(shrink_heur::fused_config(2048, 4096, 3, 16, 132, true, shrink_heur::kFusedBM, false, true).stream_k);
  // Split-K blocks past one wave (NOTES v8): T=4096 qkv r=64 makes 64 tiles x 5 splits for 264
  // slots; T=256 one slice r=64 with 32 adapters makes >= 32 tiles x 16 splits for 396 slots, but
  // with 8 adapters 8 x 16 fit. T=2048 qkv r=16 (32 x 8 for 396) stays split-K.
  EXPECT_TRUE(shrink_heur::fused_config(4096, 4096, 3, 64, 132, true, shrink_heur::kFusedBM, false, true).stream_k);
  EXPECT_TRUE(shrink_heur::fused_config(256, 8192, 1, 64, 132, true, shrink_heur::kFusedBM, false, true, 32).stream_k);
  EXPECT_FALSE(shrink_heur::fused_config(256, 8192, 1, 64, 132, true, shrink_heur::kFusedBM, false, true, 8).stream_k);
  EXPECT_FALSE(shrink_heur::fused_config(2048, 4096, 3, 16, 132, true, shrink_heur::kFusedBM, false, true, 32).stream_k);
  // Fused for one or two column groups from 129 to 1024 tokens with at most 8 adapters only.
  EXPECT_TRUE(shrink_heur::auto_fused(256, 1, 16, 8));
  EXPECT_FALSE(shrink_heur::auto_fused(256, 1, 16, 32));
  EXPECT_FALSE(shrink_heur::auto_fused(2048, 1, 16, 1));
  EXPECT_TRUE(shrink_heur::auto_fused(2048, 3, 16, 32));
  // Never without split-K allowed, and never on the explicit split-K kinds.
  EXPECT_FALSE(shrink_heur::fused_config(8192, 4096, 3, 16, 132, false, shrink_heur::kFusedBM, false, true).stream_k);
  EXPECT_FALSE(shrink_heur::fused_config(8192, 4096, 3, 16, 132).stream_k);
}

// The cluster tile: column groups of an even number of 8-column blocks, clusters along K until ~2
// CTAs per SM (or 8 CTAs, or one chunk per warp), 16-token tiles where 32-token ones stay short.
TEST(ShrinkHeuristics, ClusterTile) {
  using shrink_heur::cluster_config;
  const auto a = cluster_config(256, 4096, 1, 16, 1, 132);  // 2 blocks, 16-token tiles, C = 8
  EXPECT_EQ(a.nbw, 2);
  EXPECT_EQ(a.ncg, 1);
  EXPECT_EQ(a.mg, 1);
  EXPECT_EQ(a.tiles, 256 / 16 + 2);
  EXPECT_EQ(a.cluster, 8);
  EXPECT_EQ(a.chunks_per_cta, 4096 / 32 / 8);
  const auto b = cluster_config(2048, 4096, 3, 16, 1, 132);  // qkv r=16: 6 blocks, 32-token tiles
  EXPECT_EQ(b.nbw, 6);
  EXPECT_EQ(b.mg, 2);
  EXPECT_EQ(b.cluster, 4);  // 66 tiles x 4 >= 264
  const auto c = cluster_config(1024, 4096, 3, 64, 8, 132);  // 24 blocks: 3 groups of 8
  EXPECT_EQ(c.nbw, 8);
  EXPECT_EQ(c.ncg, 3);
  const auto d = cluster_config(300, 72, 2, 16, 3, 132);  // 3 chunks: one CTA per cluster
  EXPECT_EQ(d.cluster, 1);
  EXPECT_EQ(d.chunks_per_cta, 3);
  EXPECT_EQ(cluster_config(300, 4096, 1, 1, 3, 132).nbw, 2);  // 1 block rounds up to 2
  // Small batches: narrower column groups until the grid holds ~2 CTAs per SM.
  const auto e = cluster_config(64, 4096, 1, 64, 1, 132);  // 8 blocks as 4 groups of 2
  EXPECT_EQ(e.nbw, 2);
  EXPECT_EQ(e.ncg, 4);
  EXPECT_EQ(e.mg, 1);
  EXPECT_EQ(e.cluster, 8);
  EXPECT_EQ(cluster_config(64, 4096, 3, 64, 1, 132).nbw, 4);  // 24 blocks: 6 groups of 4 suffice
  EXPECT_EQ(cluster_config(256, 4096, 3, 16, 1, 132).nbw, 6);  // T > 128: never narrowed
  EXPECT_TRUE(shrink_heur::cluster_fits(8, 32));
  EXPECT_FALSE(shrink_heur::cluster_fits(8, 64));
  EXPECT_FALSE(shrink_heur::cluster_fits(1, 512));
  // automatic: one slice up to rank 16 for 129..2048 tokens; up to 6 blocks (qkv r=16) to 256
  // tokens with at most 8 adapters; 32..128 tokens with >= 3 blocks (>= 8 below 64 tokens) and
  // >= 8 tokens per adapter;
  // 16..31 tokens only with >= 24 blocks and one adapter's tokens; never rank 64 above 128 tokens,
  // T < 16 or T > 2048
  EXPECT_TRUE(shrink_heur::auto_cluster(64, 1, 64, 1));
  EXPECT_TRUE(shrink_heur::auto_cluster(64, 3, 16, 8));
  EXPECT_TRUE(shrink_heur::auto_cluster_small(32, 1, 64, 4));
  EXPECT_FALSE(shrink_heur::auto_cluster_small(32, 3, 16, 1));  // 6 blocks below 64 tokens
  EXPECT_TRUE(shrink_heur::auto_cluster_small(64, 1, 24, 4));
  EXPECT_TRUE(shrink_heur::auto_cluster_small(128, 3, 64, 16));
  EXPECT_FALSE(shrink_heur::auto_cluster(64, 1, 16, 1));   // 2 blocks
  EXPECT_FALSE(shrink_heur::auto_cluster(64, 1, 64, 32));  // 2 tokens per adapter
  EXPECT_TRUE(shrink_heur::auto_cluster(16, 3, 64, 1));    // T=16: 24 blocks, one adapter (v25)
  EXPECT_FALSE(shrink_heur::auto_cluster(16, 3, 64, 2));   // T=16: 8 tokens per adapter
  EXPECT_FALSE(shrink_heur::auto_cluster(16, 1, 64, 1));   // T=16: 8 blocks
  EXPECT_FALSE(shrink_heur::auto_cluster(15, 3, 64, 1));   // T < 16
  EXPECT_TRUE(shrink_heur::auto_cluster(31, 4, 64, 1));    // 32 blocks
  EXPECT_FALSE(shrink_heur::auto_cluster_small(256, 1, 64, 1));
  EXPECT_TRUE(shrink_heur::auto_cluster(256, 1, 16, 32));
  EXPECT_TRUE(shrink_heur::auto_cluster(2048, 1, 16, 1));
  EXPECT_FALSE(shrink_heur::auto_cluster(2049, 1, 16, 1));
  EXPECT_FALSE(shrink_heur::auto_cluster(128, 1, 16, 1));
  EXPECT_TRUE(shrink_heur::auto_cluster(256, 3, 16, 8));
  EXPECT_FALSE(shrink_heur::auto_cluster(256, 3, 16, 32));
  EXPECT_FALSE(shrink_heur::auto_cluster(512, 3, 16, 8));
  EXPECT_FALSE(shrink_heur::auto_cluster(256, 1, 64, 1));
  EXPECT_FALSE(shrink_heur::auto_cluster(8192, 1, 16, 1));
}

TEST(ShrinkHeuristics, DecodeKernelRange) {
  EXPECT_TRUE(shrink_heur::use_decode_kernel(1, 3, 64, 8));
  EXPECT_TRUE(shrink_heur::use_decode_kernel(63, 3, 64, 8));
  EXPECT_FALSE(shrink_heur::use_decode_kernel(64, 3, 64, 8));   // S*r = 192: fused
  EXPECT_TRUE(shrink_heur::use_decode_kernel(64, 1, 16, 8));    // r=16: decode
  EXPECT_FALSE(shrink_heur::use_decode_kernel(129, 1, 16, 8));  // prefill
}

// One slice at rank <= 32 (under 3 column groups) from 2048 tokens: the 128-token stream-K tile.
TEST(ShrinkHeuristics, FewGroupsStreamK) {
  EXPECT_TRUE(shrink_heur::auto_few_groups_sk(2048, 1, 16));
  EXPECT_TRUE(shrink_heur::auto_few_groups_sk(8192, 1, 32));   // 2 groups
  EXPECT_FALSE(shrink_heur::auto_few_groups_sk(2047, 1, 16));  // below the token floor
  EXPECT_FALSE(shrink_heur::auto_few_groups_sk(8192, 1, 33));  // 3 groups: auto_fused's own rule
  EXPECT_FALSE(shrink_heur::auto_few_groups_sk(8192, 2, 16));  // two slices: not measured
}

// The warp-k tile inside the decode band, ahead of the decode kernel: >= 32 adapters of 3-4 column
// groups, >= 3 tokens per adapter with 4 groups and >= 4 with 3 (NOTES v34 part 1).
TEST(ShrinkHeuristics, WarpKDecodeBand) {
  EXPECT_TRUE(shrink_heur::auto_wk_decode_band(96, 1, 64, 32));   // one slice r=64: 3 per adapter
  EXPECT_TRUE(shrink_heur::auto_wk_decode_band(128, 1, 64, 32));
  EXPECT_TRUE(shrink_heur::auto_wk_decode_band(128, 1, 49, 32));  // 4 groups by the padded rank
  EXPECT_FALSE(shrink_heur::auto_wk_decode_band(95, 1, 64, 32));  // under 3 per adapter
  EXPECT_TRUE(shrink_heur::auto_wk_decode_band(128, 3, 16, 32));  // qkv r=16: 4 per adapter
  EXPECT_FALSE(shrink_heur::auto_wk_decode_band(112, 3, 16, 32));
  EXPECT_FALSE(shrink_heur::auto_wk_decode_band(129, 1, 64, 32)); // past the decode band
  EXPECT_FALSE(shrink_heur::auto_wk_decode_band(128, 1, 64, 31)); // under 32 adapters
  EXPECT_FALSE(shrink_heur::auto_wk_decode_band(128, 1, 64, 64)); // 2 per adapter
  EXPECT_FALSE(shrink_heur::auto_wk_decode_band(128, 1, 32, 32)); // 2 groups
  EXPECT_FALSE(shrink_heur::auto_wk_decode_band(128, 3, 64, 32)); // 12 groups: does not fit
  // inside the band the decode kernel would have taken these shapes
  EXPECT_TRUE(shrink_heur::use_decode_kernel(96, 1, 64, 32));
  EXPECT_TRUE(shrink_heur::use_decode_kernel(128, 3, 16, 32));
}

TEST(LinearHeuristics, SplitPartialsWindow) {
  // Llama-3-8B gate_up, T=64, 8 adapters, ranks 8/16/64: the split-K GEMV path (62.7 vs 103.2 us).
  EXPECT_TRUE(linear_heur::use_split_partials(64, 8, 64, 4096, 2, 28672));
  EXPECT_TRUE(linear_heur::use_split_partials(64, 8, 64, 4096, 2, 14336));  // its tp=2 shard
  // One slice H=4096 r=64, 8 adapters: the decode kernels (25.8 vs 32.5 us).
  EXPECT_FALSE(linear_heur::use_split_partials(64, 8, 64, 4096, 1, 4096));
  // Outside 4..16 tokens per adapter: the decode kernels.
  EXPECT_FALSE(linear_heur::use_split_partials(64, 32, 16, 4096, 3, 6144));
  EXPECT_FALSE(linear_heur::use_split_partials(16, 1, 16, 4096, 1, 4096));
  EXPECT_TRUE(linear_heur::use_partials(128));
  EXPECT_FALSE(linear_heur::use_partials(129));
}

// The shrink -> mma expand path for decode-sized batches with several tokens per adapter (checked
// before the partials window, so it also takes the Llama-3-8B gate_up case above).
TEST(LinearHeuristics, TilesForManyTokensPerAdapter) {
  EXPECT_TRUE(linear_heur::use_tiles(64, 8, 64));    // 8 per adapter, r=64
  EXPECT_TRUE(linear_heur::use_tiles(16, 1, 64));    // 16 per adapter
  EXPECT_TRUE(linear_heur::use_tiles(64, 32, 64));   // 2 per adapter from T=64: the streaming expand
  EXPECT_TRUE(linear_heur::use_tiles(32, 16, 64));   // 2 per adapter below T=64 too (v25)
  EXPECT_TRUE(linear_heur::use_tiles(16, 8, 64));    // T=16, 8 adapters of rank 64
  EXPECT_FALSE(linear_heur::use_tiles(16, 16, 64));  // 1 per adapter: decode kernels
  EXPECT_FALSE(linear_heur::use_tiles(16, 8, 16));   // r=16 below 32 tokens: decode kernels
  EXPECT_TRUE(linear_heur::use_tiles(64, 8, 16));    // r=16 from 8 per adapter and T >= 32
  EXPECT_FALSE(linear_heur::use_tiles(32, 8, 16));
  EXPECT_TRUE(linear_heur::use_tiles(64, 32, 16));   // r=16, 2 per adapter from T=64 (v26)
  EXPECT_TRUE(linear_heur::use_tiles(128, 32, 16));
  EXPECT_FALSE(linear_heur::use_tiles(32, 32, 16));  // 1 per adapter: decode kernels
  EXPECT_FALSE(linear_heur::use_tiles(64, 64, 16));
  EXPECT_FALSE(linear_heur::use_tiles(16, 1, 16));
  EXPECT_FALSE(linear_heur::use_tiles(8, 1, 64));    // below 16 tokens: decode kernels
  EXPECT_TRUE(linear_heur::use_tiles(129, 64, 16));  // prefill
}

// The cluster shrink before a programmatic-dependent expand: where the cluster takes the batch, at
// rank <= 16 or >= 32 tokens per adapter.
TEST(LinearHeuristics, SmallClusterPdlExpand) {
  EXPECT_TRUE(linear_heur::small_cluster_pdl_expand(64, 3, 16, 8));    // rank 16, 8 per adapter
  EXPECT_TRUE(linear_heur::small_cluster_pdl_expand(32, 1, 64, 1));    // 32 tokens of one adapter
  EXPECT_FALSE(linear_heur::small_cluster_pdl_expand(128, 1, 64, 8));  // 16 per adapter at rank 64
  EXPECT_FALSE(linear_heur::small_cluster_pdl_expand(64, 1, 16, 1));   // not a cluster shape
  EXPECT_FALSE(linear_heur::small_cluster_pdl_expand(256, 3, 16, 1));  // T > 128
}

// The mid-batch cluster shrink inside add_lora_linear: one slice up to rank 16, 129..256 tokens,
// to 1024 at hidden sizes up to 4096.
TEST(LinearHeuristics, MidCluster) {
  EXPECT_TRUE(linear_heur::mid_cluster(256, 1, 16, 1, 8192));
  EXPECT_TRUE(linear_heur::mid_cluster(256, 1, 16, 32, 4096));
  EXPECT_TRUE(linear_heur::mid_cluster(129, 1, 8, 8, 8192));
  EXPECT_TRUE(linear_heur::mid_cluster(1024, 1, 16, 8, 4096));
  EXPECT_TRUE(linear_heur::mid_cluster(600, 1, 16, 1, 2049));
  EXPECT_FALSE(linear_heur::mid_cluster(512, 1, 16, 1, 8192));   // H=8192 from 512 tokens
  EXPECT_FALSE(linear_heur::mid_cluster(1025, 1, 16, 1, 4096));  // H=4096 T=2048: slower
  EXPECT_FALSE(linear_heur::mid_cluster(128, 1, 16, 1, 4096));   // the small path's rules
  EXPECT_FALSE(linear_heur::mid_cluster(256, 3, 16, 1, 4096));   // qkv r=16: 6 blocks, slower cold
  EXPECT_FALSE(linear_heur::mid_cluster(256, 1, 64, 1, 4096));   // 8 blocks: not lora_shrink's choice either
  EXPECT_FALSE(linear_heur::mid_cluster(256, 2, 16, 1, 4096));   // 4 blocks
}

// The held decode build only where it saves a wave (H200: 7 against 8 wide blocks per SM, 132 SMs).
TEST(ExpandHeuristics, DecodeFewerWaves) {
  const int plain = 7 * 132, occ = 8 * 132;
  EXPECT_TRUE(expand_heur::decode_fewer_waves(1024, plain, occ));   // H=4096 T=64: 2 waves -> 1
  EXPECT_TRUE(expand_heur::decode_fewer_waves(2048, plain, occ));   // H=8192 T=64: 3 -> 2
  EXPECT_FALSE(expand_heur::decode_fewer_waves(1536, plain, occ));  // qkv T=16: 2 either way
  EXPECT_FALSE(expand_heur::decode_fewer_waves(512, plain, occ));   // one wave either way
  EXPECT_FALSE(expand_heur::decode_fewer_waves(1024, occ, occ));
  EXPECT_FALSE(expand_heur::decode_fewer_waves(1024, 1, 1));        // unreadable occupancy (device_wave's 1)
  EXPECT_FALSE(expand_heur::decode_fewer_waves(1024, 0, 0));
}

TEST(ExpandHeuristics, DecodeGemvWindow) {
  {  // per-token decode blocks at rank <= 16: wide past 1024 narrow (64-column) blocks
    const int64_t h4096[1] = {4096}, qkv[3] = {4096, 1024, 1024};
    EXPECT_FALSE(expand_heur::decode_wide(1, qkv, 3, 16));     // T=1 stays spread over the SMs
    EXPECT_TRUE(expand_heur::decode_wide(16, qkv, 3, 16));     // 96 chunks x 16
    EXPECT_FALSE(expand_heur::decode_wide(16, h4096, 1, 16));  // 64 chunks x 16 = 1024
    EXPECT_TRUE(expand_heur::decode_wide(17, h4096, 1, 16));
    EXPECT_FALSE(expand_heur::decode_wide(64, h4096, 1, 32));  // above rank 16: measured slower
  }
  EXPECT_TRUE(expand_heur::decode_use_gemv(64, 8));
  EXPECT_FALSE(expand_heur::decode_use_gemv(64, 1));   // 64 tokens of one adapter
  EXPECT_FALSE(expand_heur::decode_use_gemv(64, 32));  // 2 tokens per adapter
  EXPECT_FALSE(expand_heur::decode_use_gemv(16, 2));
}

// Which prefill kernel an expand call runs, from its shapes and pointer alignment (nothing is
// dereferenced or launched).
LoraExpandArgs expand_args(int64_t T, int max_rank, int64_t offset, DType in = DType::f32) {
  static const void* aligned = reinterpret_cast<const void*>(uintptr_t(1) << 20);
  LoraExpandArgs a;
  a.in_dtype = in;
  a.dtype = DType::bf16;
  a.num_tokens = T;
  a.x = aligned;
  a.num_slices = 3;
  const int64_t w[3] = {4096, 1024, 1024};
  for (int s = 0; s < 3; ++s) {
    a.lora_b[s] = aligned;
    a.slice_width[s] = w[s];
  }
  a.max_loras = 8;
  a.max_rank = max_rank;
  a.y = const_cast<void*>(aligned);
  a.y_row_stride = 6144 + offset + 8;
  a.offset_start = offset;
  return a;
}

TEST(ExpandHeuristics, PrefillKernelChoice) {
  using K = ExpandPrefillKernel;
  EXPECT_EQ(detail::expand_prefill_kernel(expand_args(8192, 16, 0), K::automatic), K::mma_pipe);
  EXPECT_EQ(detail::expand_prefill_kernel(expand_args(8192, 64, 0), K::automatic), K::mma_pipe);
  // ranks 65-128: the pipelined kernel at RK = 128 with an fp32 x (expand_heur::pipe128_ok); a
  // 16-bit x, or a rank above 128, the streaming kernel
  EXPECT_EQ(detail::expand_prefill_kernel(expand_args(8192, 128, 0), K::automatic), K::mma_pipe);
  EXPECT_EQ(detail::expand_prefill_kernel(expand_args(8192, 72, 0), K::automatic), K::mma_pipe);
  EXPECT_EQ(detail::expand_prefill_kernel(expand_args(8192, 128, 0, DType::bf16), K::automatic), K::mma_stream);
  EXPECT_EQ(detail::expand_prefill_kernel(expand_args(8192, 136, 0), K::automatic), K::mma_stream);
  EXPECT_EQ(detail::expand_prefill_kernel(expand_args(8192, 256, 0), K::mma_pipe), K::mma_stream);
  EXPECT_TRUE(expand_heur::pipe128_ok(DType::f32, 128));
  EXPECT_FALSE(expand_heur::pipe128_ok(DType::f32, 64));  // the 64-rank kernels' range
  EXPECT_FALSE(expand_heur::pipe128_ok(DType::bf16, 128));
  // the streaming kernel: two rank chunks in shared memory above rank 64, one up to it
  EXPECT_EQ(expand_heur::stream_chunks(65), 2);
  EXPECT_EQ(expand_heur::stream_chunks(512), 2);
  EXPECT_EQ(expand_heur::stream_chunks(64), 1);
  EXPECT_EQ(expand_heur::stream_chunks(16), 1);
  EXPECT_EQ(detail::expand_prefill_kernel(expand_args(8192, 16, 0), K::mma_stream), K::mma_stream);
  EXPECT_EQ(detail::expand_prefill_kernel(expand_args(8192, 16, 0), K::mma_staged), K::mma_staged);
  // Slice columns off 16-byte alignment: only the staged kernel's scalar paths apply.
  EXPECT_EQ(detail::expand_prefill_kernel(expand_args(8192, 16, 3), K::automatic), K::mma_staged);
  // Decode-sized batches: the mma kernels only with several tokens per adapter (8 adapters here),
  // the streaming one above rank 16; ranks off a multiple of 8: not a prefill (mma) kernel.
  EXPECT_EQ(detail::expand_prefill_kernel(expand_args(128, 16, 0), K::automatic), K::mma_pipe);
  EXPECT_EQ(detail::expand_prefill_kernel(expand_args(32, 16, 0), K::automatic), K::automatic);
  EXPECT_EQ(detail::expand_prefill_kernel(expand_args(16, 64, 0), K::automatic), K::mma_stream);  // 2 per adapter (v25)
  EXPECT_EQ(detail::expand_prefill_kernel(expand_args(8, 64, 0), K::automatic), K::automatic);     // below 16 tokens
  // 8 tokens per adapter above rank 16 from 64 tokens: the 16-row pipelined tiles
  // (expand_heur::pipe_few_tokens) with an fp32 x; a 16-bit x, or fewer than 64 tokens (not
  // measured), keep the streaming kernel
  EXPECT_EQ(detail::expand_prefill_kernel(expand_args(64, 64, 0), K::automatic), K::mma_pipe);
  EXPECT_EQ(detail::expand_prefill_kernel(expand_args(64, 64, 0, DType::bf16), K::automatic), K::mma_stream);
  EXPECT_EQ(detail::expand_prefill_kernel(expand_args(32, 64, 0), K::automatic), K::mma_stream);
  // Above rank 16 the streaming kernel up to 512 tokens, the pipelined one beyond.
  EXPECT_EQ(detail::expand_prefill_kernel(expand_args(512, 64, 0), K::automatic), K::mma_stream);
  EXPECT_EQ(detail::expand_prefill_kernel(expand_args(1024, 64, 0), K::automatic), K::mma_pipe);
  EXPECT_EQ(detail::expand_prefill_kernel(expand_args(512, 16, 0), K::automatic), K::mma_pipe);
  // After add_lora_linear's shrink the pipelined kernel (the programmatic dependent) from 16 tokens
  // per adapter (NOTES v9): T=256 with 8 adapters (32 per adapter) the 64-row tiles; with 32 adapters
  // (8 per adapter) the 16-row tiles (pipe_few_tokens, NOTES v22), which the streaming kernel took
  // before; likewise up to 16 per adapter (T=512) alone, where after the shrink the 64-row tiles run.
  EXPECT_EQ(detail::expand_prefill_kernel(expand_args(256, 64, 0), K::automatic, true), K::mma_pipe);
  EXPECT_FALSE(expand_heur::pipe_few_tokens(256, 64, 8));
  auto many = expand_args(256, 64, 0);
  many.max_loras = 32;
  EXPECT_TRUE(expand_heur::pipe_few_tokens(256, 64, 32));
  EXPECT_EQ(detail::expand_prefill_kernel(many, K::automatic, true), K::mma_pipe);
  EXPECT_EQ(detail::expand_prefill_kernel(many, K::automatic), K::mma_pipe);
  many.num_tokens = 512;
  EXPECT_TRUE(expand_heur::pipe_few_tokens(512, 64, 32));
  EXPECT_FALSE(expand_heur::pipe_few_tokens(513, 64, 32));  // 17 per adapter
  EXPECT_FALSE(expand_heur::pipe_few_tokens(600, 64, 80));  // past the streaming kernel's 512 tokens
  // after the shrink 16 per adapter is not the streaming kernel's, so not its replacement's either
  EXPECT_FALSE(expand_heur::prefer_stream_after_shrink(512, 64, 32));
  EXPECT_EQ(detail::expand_prefill_kernel(many, K::automatic, true), K::mma_pipe);
  EXPECT_EQ(detail::expand_prefill_kernel(many, K::automatic), K::mma_pipe);
  many.num_tokens = 256;
  many.max_rank = 128;  // above the pipelined kernel's ranks
  EXPECT_FALSE(expand_heur::pipe_few_tokens(256, 128, 32));
  EXPECT_EQ(detail::expand_prefill_kernel(many, K::automatic), K::mma_stream);
  many.max_rank = 64;
  many.num_tokens = 1024;  // past the streaming kernel's range
  EXPECT_EQ(detail::expand_prefill_kernel(many, K::automatic, true), K::mma_pipe);
  EXPECT_EQ(detail::expand_prefill_kernel(expand_args(8, 64, 0), K::mma_pipe), K::mma_pipe);
  EXPECT_EQ(detail::expand_prefill_kernel(expand_args(128, 12, 0), K::automatic), K::automatic);
  EXPECT_EQ(detail::expand_prefill_kernel(expand_args(8192, 12, 0), K::automatic), K::automatic);
}

// Which embedding / logits calls take the pipelined tensor-core expand (launch_expand_pipe); the
// rest keep the sorted CUDA-core expand. Host pointers stand in for device ones: only their
// alignment and presence are looked at.
TEST(ExpandPipeRouting, Preconditions) {
  alignas(16) static int32_t meta_words[8][4] = {};
  alignas(16) static uint16_t x[64], b[64], y[64];
  auto base = [&] {
    LoraExpandArgs a;
    a.in_dtype = DType::bf16;
    a.dtype = DType::bf16;
    a.num_tokens = 1000;
    a.x = x;
    a.num_slices = 1;
    a.lora_b[0] = b;
    a.slice_width[0] = 4096;
    a.max_loras = 8;
    a.max_rank = 16;
    a.lora_ranks = meta_words[0];
    a.meta.token_lora_mapping = meta_words[1];
    a.meta.sorted_token_ids = meta_words[2];
    a.meta.active_lora_ids = meta_words[3];
    a.meta.num_tokens_per_lora = meta_words[4];
    a.meta.lora_token_start_loc = meta_words[5];
    a.meta.no_lora_flag = meta_words[6];
    a.y = y;
    a.y_row_stride = 4096;
    return a;
  };
  const int32_t* ids = meta_words[7];
  EXPECT_TRUE(detail::expand_pipe_ok(base(), ids));      // embedding prefill
  EXPECT_TRUE(detail::expand_pipe_ok(base(), nullptr));  // plain x
  {
    LoraExpandArgs a = base();
    a.in_dtype = DType::f32;  // logits: fp32 u
    EXPECT_TRUE(detail::expand_pipe_ok(a, nullptr));
    EXPECT_FALSE(detail::expand_pipe_ok(a, ids));  // gathered rows must be of B's dtype
  }
  auto refused = [&](auto edit) {
    LoraExpandArgs a = base();
    edit(a);
    return !detail::expand_pipe_ok(a, ids);
  };
  EXPECT_TRUE(refused([](LoraExpandArgs& a) { a.num_tokens = 128; }));  // decode sizes: sorted expand
  EXPECT_FALSE(refused([](LoraExpandArgs& a) { a.num_tokens = 129; }));
  EXPECT_FALSE(refused([](LoraExpandArgs& a) { a.max_rank = 64; }));
  EXPECT_TRUE(refused([](LoraExpandArgs& a) { a.max_rank = 72; }));   // above the pipe's rank
  EXPECT_TRUE(refused([](LoraExpandArgs& a) { a.max_rank = 12; }));   // rows not 16-byte
  EXPECT_TRUE(refused([](LoraExpandArgs& a) { a.dtype = a.in_dtype = DType::f32; }));
  EXPECT_TRUE(refused([](LoraExpandArgs& a) { a.slice_width[0] = 2049; a.y_row_stride = 2049; }));
  EXPECT_TRUE(refused([](LoraExpandArgs& a) { a.y_row_stride = 4100; }));
  EXPECT_TRUE(refused([](LoraExpandArgs& a) { a.y = reinterpret_cast<uint8_t*>(y) + 2; }));
  EXPECT_TRUE(refused([](LoraExpandArgs& a) { a.num_slices = 2; a.slice_width[1] = 8; a.lora_b[1] = b; }));
  EXPECT_TRUE(refused([](LoraExpandArgs& a) { a.lora_ranks = nullptr; }));
  EXPECT_TRUE(refused([](LoraExpandArgs& a) { a.meta.no_lora_flag = nullptr; }));
  EXPECT_TRUE(refused([](LoraExpandArgs& a) { a.meta.active_lora_ids = nullptr; }));
  EXPECT_TRUE(refused([](LoraExpandArgs& a) { a.num_tokens = 64 * 65535; }));  // grid y extent
}

// One adapter at 16-48 tokens above rank 16: the pipelined kernel, not the streaming one
// (expand_heur::one_adapter_pipe, NOTES v34 part 1).
TEST(ExpandHeuristics, OneAdapterPipe) {
  for (int64_t T : {16, 24, 33, 48}) {
    EXPECT_TRUE(expand_heur::one_adapter_pipe(T, 64, 1)) << T;
    EXPECT_TRUE(expand_heur::one_adapter_pipe(T, 24, 1)) << T;
    EXPECT_TRUE(expand_heur::prefer_stream(T, 64));  // the rule it overrides
  }
  EXPECT_FALSE(expand_heur::one_adapter_pipe(15, 64, 1));  // the decode kernel's region
  EXPECT_FALSE(expand_heur::one_adapter_pipe(49, 64, 1));
  EXPECT_FALSE(expand_heur::one_adapter_pipe(64, 64, 1));  // measured slower (1.04-1.17)
  EXPECT_FALSE(expand_heur::one_adapter_pipe(32, 16, 1));  // rank <= 16: its own rules
  EXPECT_FALSE(expand_heur::one_adapter_pipe(32, 65, 1));  // past the pipelined kernel's rank
  EXPECT_FALSE(expand_heur::one_adapter_pipe(32, 64, 2));  // two adapters planned
  EXPECT_FALSE(expand_heur::one_adapter_pipe(32, 64, 32));  // slots, whatever num_active_loras says
}

// The expand's token rows per block on a 132-SM device: 64 until the grid stays under 4 blocks per
// SM (2 with one adapter), then 32, then 16 (16 only up to 128 tokens). The first four shapes are
// lora_expand_test's SmallTokenTiles (its comments say which tile height each reaches).
TEST(ExpandHeuristics, SmallTokenTiles) {
  using expand_heur::small_bm;
  EXPECT_EQ(small_bm(64, 1, 8, 132), 16);     // T=64, one 1024-column slice
  EXPECT_EQ(small_bm(100, 4, 12, 132), 16);   // 1024 + 256 + 256 columns, 4 adapters
  EXPECT_EQ(small_bm(40, 2, 8, 132), 16);
  EXPECT_EQ(small_bm(300, 2, 32, 132), 32);   // 4096 columns: 320 blocks of 32 rows
  EXPECT_EQ(small_bm(64, 1, 32, 132), 16);    // the bench's H=4096, one adapter
  EXPECT_EQ(small_bm(512, 1, 64, 132), 64);   // H=8192: 512 blocks of 64 rows
  EXPECT_EQ(small_bm(64, 32, 32, 132), 64);   // a partial tile per adapter fills the grid
  EXPECT_EQ(small_bm(256, 1, 32, 132), 32);   // one adapter: 256 blocks of 32 rows reach 2 per SM
  EXPECT_EQ(small_bm(64, 8, 64, 132), 32);    // 8 adapters: 4 per SM wanted
  EXPECT_EQ(small_bm(256, 8, 32, 132), 32);   // 16 rows would be taken, but not above 128 tokens
  EXPECT_EQ(small_bm(2048, 8, 32, 132), 64);
}

// The pipelined expand's token-tile estimate for its tiles-per-block choice: one partial tile per
// adapter of an even split, never below ceil(T / BM).
TEST(ExpandHeuristics, PipeTokenTiles) {
  using expand_heur::pipe_token_tiles;
  EXPECT_EQ(pipe_token_tiles(256, 1, 64), 4);      // one adapter: ceil(T / BM)
  EXPECT_EQ(pipe_token_tiles(256, 32, 64), 32);    // 8 tokens each: a tile per adapter (was 4)
  EXPECT_EQ(pipe_token_tiles(64, 32, 16), 32);     // 2 tokens each, 16-row tiles (was 4)
  EXPECT_EQ(pipe_token_tiles(256, 8, 64), 8);      // 32 tokens each
  EXPECT_EQ(pipe_token_tiles(2048, 32, 64), 32);   // 64 tokens each: exactly T / BM
  EXPECT_EQ(pipe_token_tiles(8192, 8, 64), 128);
  EXPECT_EQ(pipe_token_tiles(100, 3, 64), 3);      // 34 tokens each
  EXPECT_EQ(pipe_token_tiles(130, 2, 64), 4);      // 65 each: two tiles per adapter
  EXPECT_EQ(pipe_token_tiles(5, 32, 16), 5);       // fewer tokens than adapters
  EXPECT_EQ(pipe_token_tiles(0, 8, 64), 0);
  EXPECT_EQ(pipe_token_tiles(64, 0, 64), 1);       // no adapter slot: treated as one
}

// The pipelined expand's tiles per block: the wave fit up to the cap, and for the 64 x 64 kernel
// (one_wave_max 16) longer blocks only where every working block then fits into one wave. 396
// slots = 132 SMs x 3 blocks.
TEST(ExpandHeuristics, PipeNtbOneWave) {
  using expand_heur::pipe_ntb;
  using expand_heur::pipe_token_tiles;
  const int64_t h8192[] = {128}, h4096[] = {64}, qkv[] = {64, 16, 16}, gate_up[] = {224, 224};
  // H=8192, T=2048, one adapter: 4096 tiles want 11 per block; 11 gives 12 x 32 = 384 <= 396 blocks.
  EXPECT_EQ(pipe_ntb(h8192, 1, pipe_token_tiles(2048, 1, 64), 396, 8, 16), 11);
  EXPECT_EQ(pipe_ntb(h8192, 1, pipe_token_tiles(2048, 1, 64), 396, 8, 0), 8);  // off: the cap
  // 32 adapters: 32 token tiles again (64 tokens each), the same 11
  EXPECT_EQ(pipe_ntb(h8192, 1, pipe_token_tiles(2048, 32, 64), 396, 8, 16), 11);
  // H=4096, T=2048: 6 per block already fit one wave; the rule does not lengthen them.
  EXPECT_EQ(pipe_ntb(h4096, 1, pipe_token_tiles(2048, 1, 64), 396, 8, 16), 6);
  // qkv T=2048: 96 x 32 tiles want 8, within the cap
  EXPECT_EQ(pipe_ntb(qkv, 3, pipe_token_tiles(2048, 8, 64), 396, 8, 16), 8);
  // Llama-3-8B gate_up, 4 x 256 tokens, 8 adapters: even 16 per block leaves 28 x 16 = 448 > 396
  // blocks (the case a cap of 16 slowed down, 1.087): keep 8.
  EXPECT_EQ(pipe_ntb(gate_up, 2, pipe_token_tiles(1024, 8, 64), 396, 8, 16), 8);
  // T=8192 one slice H=4096: 64 x 128 tiles want 21, no count up to 16 fits one wave: the cap.
  EXPECT_EQ(pipe_ntb(h4096, 1, pipe_token_tiles(8192, 1, 64), 396, 8, 16), 8);
  // per-slice rounding counts: 3 slices of 9 tiles, 40 token tiles, 80 slots: want 14 > 8;
  // 9 per block gives 3 x 40 = 120 > 80 blocks, never one wave up to 16: the cap.
  const int64_t nine[] = {9, 9, 9};
  EXPECT_EQ(pipe_ntb(nine, 3, 40, 80, 8, 16), 8);
  // small batches: one tile per block, never 0
  EXPECT_EQ(pipe_ntb(h4096, 1, 1, 396, 8, 16), 1);
  EXPECT_EQ(pipe_ntb(h4096, 1, 0, 396, 8, 16), 1);
}

// pipe_ntb's round_spill (the 16-row rank <= 16 kernel, expand_heur::kPipe16FewOneWave): the count
// within the cap that spills past one wave only through each slice's rounding.
TEST(ExpandHeuristics, PipeNtbRoundSpill) {
  using expand_heur::pipe_ntb;
  using expand_heur::pipe_token_tiles;
  const int64_t qkv[] = {32, 8, 8}, one[] = {32};
  const int64_t tt = pipe_token_tiles(256, 32, 16);  // 32 adapters of 8 tokens: one 16-row tile each
  ASSERT_EQ(tt, 32);
  // 48 x 32 tiles want 3 per block (the cap for 3 slices), but 11 + 3 + 3 = 17 x 32 = 544 > 528
  // blocks; 4 give 12 x 32 = 384.
  EXPECT_EQ(pipe_ntb(qkv, 3, tt, 528, 3, expand_heur::kPipe16FewOneWave, true), 4);
  EXPECT_EQ(pipe_ntb(qkv, 3, tt, 528, 3, expand_heur::kPipe16FewOneWave, false), 3);  // off: as before
  EXPECT_EQ(pipe_ntb(qkv, 3, tt, 544, 3, 4, true), 3);  // 544 slots: 3 already fits one wave
  // 64 token tiles: 4 per block still leaves 12 x 64 = 768 > 528 blocks: the cap
  EXPECT_EQ(pipe_ntb(qkv, 3, 64, 528, 3, 4, true), 3);
  // one slice: 2 per block fit (16 x 32 = 512), no spill, no change
  EXPECT_EQ(pipe_ntb(one, 1, tt, 528, 4, 4, true), 2);
  // the spill is checked at the wave fit's own count: 34 x 30 tiles want 2 per block, which spill
  // ((17 + 1) x 30 = 540 > 528 blocks); 3 give (11 + 1) x 30 = 360
  const int64_t odd[] = {33, 1};
  EXPECT_EQ(pipe_ntb(odd, 2, 30, 528, 3, 4, false), 2);
  EXPECT_EQ(pipe_ntb(odd, 2, 30, 528, 3, 4, true), 3);
}

// The launch grids' token-tile bound (token_tile_bound): never below the tiles find_tile returns for
// any split of T tokens over the entries, and tight for one entry.
TEST(TileBound, CoversEverySplitAndIsTight) {
  EXPECT_EQ(token_tile_bound(256, 1, 64), 4);    // one adapter: exactly ceil(T / 64) (was 6)
  EXPECT_EQ(token_tile_bound(256, 2, 64), 5);    // one adapter and the -1 entry (the shrink's grid)
  EXPECT_EQ(token_tile_bound(256, 33, 64), 36);  // was 37
  EXPECT_EQ(token_tile_bound(64, 2, 16), 5);
  EXPECT_EQ(token_tile_bound(5, 32, 16), 5);     // fewer tokens than entries
  EXPECT_EQ(token_tile_bound(0, 8, 64), 1);
  uint64_t rng = 12345;
  auto next = [&rng](uint64_t n) { rng = rng * 6364136223846793005ull + 1442695040888963407ull; return (rng >> 33) % n; };
  for (int it = 0; it < 20000; ++it) {
    const int bm = 16 << next(3);
    const int64_t T = int64_t(next(700)), entries = 1 + int64_t(next(40));
    std::vector<int64_t> n(std::size_t(entries), 0);
    for (int64_t t = 0; t < T; ++t) ++n[std::size_t(next(uint64_t(entries)))];
    int64_t tiles = 0;
    for (int64_t c : n) tiles += (c + bm - 1) / bm;
    ASSERT_LE(tiles, token_tile_bound(T, entries, bm)) << "T=" << T << " entries=" << entries << " bm=" << bm;
    ASSERT_LE(token_tile_bound(T, entries, bm), std::max<int64_t>(1, (T + bm - 1) / bm + entries));
  }
}

// 16-row pipelined tiles above 128 tokens only with several adapters of <= 16 tokens each.
TEST(ExpandHeuristics, Pipe16Few) {
  using expand_heur::pipe16_few;
  EXPECT_TRUE(pipe16_few(256, 32));    // 8 tokens per adapter
  EXPECT_TRUE(pipe16_few(512, 32));    // 16: the bound
  EXPECT_FALSE(pipe16_few(513, 32));
  EXPECT_FALSE(pipe16_few(256, 8));    // 32 per adapter: small_bm decides
  EXPECT_TRUE(pipe16_few(128, 32));    // also up to 128 tokens (small_bm would take 64 rows)
  EXPECT_TRUE(pipe16_few(64, 8));      // 8 per adapter
  EXPECT_FALSE(pipe16_few(64, 2));     // 32 per adapter
  EXPECT_FALSE(pipe16_few(256, 1));    // one adapter: B would be re-read per tile
}

// The pipelined expand's column tiles per block at rank <= 16: 3 for two or more slices, 4 for one
// (results/NOTES.md v17 part 1).
TEST(ExpandHeuristics, PipeTilesMultiSlice) {
  EXPECT_EQ(expand_heur::pipe_tiles16(1), 4);
  EXPECT_EQ(expand_heur::pipe_tiles16(2), 3);
  EXPECT_EQ(expand_heur::pipe_tiles16(3), 3);
}

// The fused MoE LoRA split form (kernels/fused_moe_lora/heuristics.h): tensor-core tiles over the
// aligned path's blocks, the one call's shrink split over K into the scratch; the CUDA-core kernels
// for naive routing, few pairs per block (the split API's shrink), an intermediate not in the output
// dtype or ranks past 64 (expand); one kernel without scratch.
TEST(MoeHeuristics, SplitFormKernels) {
  auto mk = [](int64_t M, int k, int E, int L, int r, int64_t K, int64_t N, int S) {
    FusedMoeLoraArgs a;
    a.num_tokens = M; a.top_k = k; a.num_experts = E; a.max_loras = L; a.max_rank = r; a.hidden = K;
    a.slice_width = N; a.num_slices = S;
    a.routing.naive = moe_lora_use_naive(M, k, E, L, false);
    a.routing.block_size = 16;
    a.routing.max_padded = moe_lora_align_sizes(M * k, E, 16, false).max_padded;
    return a;
  };
  using moe_heur::Kernel;
  // Mixtral w13 (H 4096, I 14336, E 8, k 2), 4 adapters
  auto p = moe_heur::plan(mk(4096, 2, 8, 4, 16, 4096, 14336, 2), true);
  EXPECT_EQ(p.shrink, Kernel::mma);
  EXPECT_EQ(p.expand, Kernel::mma);
  EXPECT_EQ(p.items, 552);  // 512 full blocks + one partial per (entry, expert)
  EXPECT_EQ(p.tiles_per_block, 8);
  EXPECT_EQ(p.items_per_block, 4);  // 4 blocks of <= 16 pairs share each B tile
  EXPECT_EQ(p.name(), "shrink=mma expand=mma");
  EXPECT_EQ(p.ksplit, 1);  // 552 x 2 blocks fill the grid (and 8192 pairs: no split-K region)
  p = moe_heur::plan(mk(512, 2, 8, 4, 64, 4096, 14336, 2), true);
  EXPECT_EQ(p.shrink, Kernel::mma);  // 1024 pairs over 104 items
  EXPECT_EQ(p.expand, Kernel::mma);
  EXPECT_EQ(p.items_per_block, 1);   // 1024 pairs over 5 x 8 (slot, expert) runs: ~1.6 blocks each
  EXPECT_EQ(p.ksplit, 3);            // 208 blocks -> 624
  EXPECT_EQ(p.name(), "shrink=mma/k3 expand=mma");
  EXPECT_EQ(moe_heur::plan(mk(4096, 2, 8, 4, 64, 4096, 14336, 2), true).items_per_block, 2);  // rank 64
  EXPECT_EQ(moe_heur::plan(mk(512, 8, 128, 4, 16, 768, 2048, 1), true).items_per_block, 1);  // Qwen w2
  auto bs32 = mk(4096, 2, 8, 4, 16, 4096, 14336, 2);
  bs32.routing.block_size = 32;
  EXPECT_EQ(moe_heur::plan(bs32, true).items_per_block, 1);
  p = moe_heur::plan(mk(64, 2, 8, 4, 16, 4096, 14336, 2), true);
  EXPECT_EQ(p.shrink, Kernel::mma);  // 128 pairs over 48 items: split-K over 6 blocks each
  EXPECT_EQ(p.ksplit, 6);
  EXPECT_EQ(p.expand, Kernel::mma);
  // the split API has no room for the parts: the old rule (the row split spreads wider)
  EXPECT_EQ(moe_heur::plan(mk(64, 2, 8, 4, 16, 4096, 14336, 2), true, false).name(), "shrink=rows expand=mma");
  EXPECT_EQ(moe_heur::plan(mk(512, 2, 8, 4, 16, 4096, 14336, 2), true, false).name(), "shrink=mma expand=mma");
  // Mixtral w2 (K = I = 14336): up to 16 parts of >= 512, the grid at 528 blocks
  EXPECT_EQ(moe_heur::plan(mk(16, 2, 8, 4, 16, 14336, 4096, 1), true).name(), "shrink=mma/k16 expand=mma");
  EXPECT_EQ(moe_heur::plan(mk(64, 2, 8, 4, 16, 14336, 4096, 1), true).ksplit, 11);  // 48 items
  EXPECT_EQ(moe_heur::plan(mk(64, 2, 8, 4, 64, 14336, 4096, 1), true).ksplit, 11);
  EXPECT_EQ(moe_heur::plan(mk(512, 2, 8, 4, 16, 14336, 4096, 1), true).ksplit, 6);   // 104 items
  EXPECT_EQ(moe_heur::plan(mk(2048, 2, 8, 4, 16, 14336, 4096, 1), true).ksplit, 2);  // 4096 pairs: 2 parts fit
  EXPECT_EQ(moe_heur::plan(mk(4096, 2, 8, 4, 16, 14336, 4096, 1), true).ksplit, 1);
  // Qwen3-30B-A3B w13 T=64 (K 2048, E 128, k 8): 544 items x 2 slices already fill it; T=16 2 parts
  p = moe_heur::plan(mk(64, 8, 128, 4, 16, 2048, 768, 2), true);
  EXPECT_EQ(p.name(), "shrink=mma expand=mma");
  EXPECT_EQ(p.items, 544);
  EXPECT_EQ(moe_heur::plan(mk(16, 8, 128, 4, 16, 2048, 768, 2), true).ksplit, 2);
  EXPECT_EQ(moe_heur::plan(mk(64, 2, 8, 4, 16, 1000, 4096, 1), true).ksplit, 1);  // K < 2 x 512
  // the scratch: the intermediate, then tickets [S][2 M k] and parts [16 / 8 / ...][S][M k][r] fp32
  EXPECT_EQ(moe_heur::split_max_parts(128), 16);
  EXPECT_EQ(moe_heur::split_max_parts(1024), 8);
  EXPECT_EQ(moe_heur::split_max_parts(8192), 1);
  EXPECT_EQ(fused_moe_lora_workspace_bytes(64, 2, 1, 16, DType::bf16), 4096u + 1024u + 16u * 128 * 16 * 4);
  EXPECT_EQ(fused_moe_lora_workspace_bytes(4096, 2, 2, 64, DType::bf16), 8192u * 2 * 64 * 2);  // no region
  EXPECT_EQ(fused_moe_lora_workspace_bytes(64, 2, 1, 128, DType::bf16), 128u * 128 * 2);       // rank > 64
  p = moe_heur::plan(mk(1, 2, 8, 4, 16, 4096, 14336, 2), true);  // naive routing
  EXPECT_EQ(p.name(), "shrink=rows expand=rows");
  auto f32 = mk(4096, 2, 8, 4, 16, 4096, 14336, 2);
  f32.intermediate_dtype = DType::f32;  // not an mma operand
  EXPECT_EQ(moe_heur::plan(f32, true).expand, Kernel::rows);
  EXPECT_EQ(moe_heur::plan(f32, true).shrink, Kernel::mma);  // fp32 parts rounded to fp32
  EXPECT_EQ(moe_heur::plan(mk(4096, 2, 8, 4, 128, 4096, 14336, 2), true).name(), "shrink=rows expand=rows");
  EXPECT_EQ(moe_heur::plan(mk(4096, 2, 8, 200, 16, 4096, 14336, 2), true).expand, Kernel::rows);  // > 128 entries
  EXPECT_EQ(moe_heur::plan(mk(4096, 2, 8, 4, 16, 4096, 14336, 2), false).name(), "fused");
}

// bgmv MoE LoRA deltas (kernels/bgmv_moe_lora_delta/heuristics.h): the pairs path at decode, the
// grouped path from 2 pairs per (adapter, expert) with its tile height, the on-chip column bound.
TEST(BgmvMoeDeltaHeuristics, PathsOnTheBenchPresets) {
  BgmvMoeGemm1Args a;
  a.top_k = 2; a.num_experts = 8; a.max_loras = 4; a.rank = 16; a.hidden = 4096; a.intermediate = 14336;  // Mixtral
  auto path = [&](int64_t T) { a.num_tokens = T; return plan_bgmv_moe_gemm1(a); };
  EXPECT_EQ(path(1).path, BgmvMoePath::pairs);
  EXPECT_EQ(path(16).path, BgmvMoePath::pairs);  // 32 pairs over 32 groups
  EXPECT_EQ(path(64).path, BgmvMoePath::grouped);
  EXPECT_EQ(path(64).block_m, 16);
  EXPECT_EQ(path(512).block_m, 32);   // 32 pairs per group
  EXPECT_EQ(path(4096).block_m, 64);
  // The grouped grid's splits: ~40 live alignment blocks at T = 64 (8 full + 32 partial), so the
  // shrink's K splits 8 ways (>= 512 each) and the 448 expand tiles 27 ways; 160 at T = 4096.
  EXPECT_EQ(path(64).k_split, 8);
  EXPECT_EQ(path(64).col_split, 27);
  EXPECT_EQ(path(4096).k_split, 4);
  EXPECT_EQ(path(4096).col_split, 7);
  EXPECT_NE(describe_bgmv_moe_gemm1_plan(a).find("grouped bm64 ks4 cs7"), std::string::npos);
  a.hidden = 700;  // K < 1024: no K split
  EXPECT_EQ(path(64).k_split, 1);
  a.hidden = 4096;
  a.top_k = 8; a.num_experts = 128;  // Qwen3-30B-A3B: 512 groups
  EXPECT_EQ(path(64).path, BgmvMoePath::pairs);
  EXPECT_EQ(path(512).path, BgmvMoePath::grouped);
  a.rank = 256;  // regular: 2 x 256 intermediate columns do not fit the tile
  EXPECT_EQ(path(4096).path, BgmvMoePath::pairs);
  a.shared_a = true;
  EXPECT_EQ(path(4096).path, BgmvMoePath::grouped);
  EXPECT_NE(describe_bgmv_moe_gemm1_plan(a).find("grouped bm64"), std::string::npos);
  BgmvMoeGemm2Args b;
  b.num_tokens = 4096; b.top_k = 6; b.num_experts = 64; b.max_loras = 4; b.rank = 64;  // DeepSeek-V2-Lite
  b.hidden = 2048; b.intermediate = 1408;
  EXPECT_EQ(plan_bgmv_moe_gemm2(b).path, BgmvMoePath::grouped);
  EXPECT_EQ(plan_bgmv_moe_gemm2(b).k_split, 1);    // 640 live blocks (384 full + 256 partial)
  EXPECT_EQ(plan_bgmv_moe_gemm2(b).col_split, 2);  // of 32 tiles
  b.num_tokens = 1;
  EXPECT_EQ(plan_bgmv_moe_gemm2(b).path, BgmvMoePath::pairs);
}

}  // namespace
}  // namespace punica::kernels
