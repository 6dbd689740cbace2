// The FlashInfer MoE LoRA deltas' floor and cuBLAS baseline (issue 45; README, "Floors and
// baselines"), recounted here from the problem's own tensors: x rows of the tokens with a delta
// (gemm2: act rows of the active slots), A and B at true rank per touched (adapter, expert) (once
// per adapter with a stride-0 expert dim; shared-A mode's own, smaller, A and fused B), every output
// element (gemm1's zero rows included), FLOPs at true rank; grouped GEMMs per (adapter, expert).
#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "apps/punica-bench/problem.h"
#include "apps/punica-bench/scenario.h"

namespace punica::bench {
namespace {

Case one(const std::string& op, const std::string& extra = "") {
  const std::string text = R"({"schema": "punica-bench.scenario/1", "name": "w", "defaults": {}, "cases": [
      {"name": "w", "op": ")" + op + R"(", "hidden": 72, "moe_intermediate": 40, "num_experts": 8, "top_k": 2,
       "max_loras": 4, "num_adapters": 3, "ranks": [16, 8, 5], "max_rank": 16, "num_requests": 24,
       "no_lora_fraction": 0.25, "seed": 3)" + extra + "}]}";
  return parse_scenario(text, "mem.json").cases.at(0);
}
std::vector<int32_t> ints(const Problem& p, const std::string& name) {
  for (const auto& t : p.tensors)
    if (t.name == name) {
      std::vector<int32_t> v(t.numel());
      std::memcpy(v.data(), t.data.data(), t.bytes());
      return v;
    }
  throw std::runtime_error("no tensor " + name);
}

struct Touch {
  std::map<std::pair<int, int>, int64_t> pairs;
  std::set<int64_t> tokens;
  std::set<int> slots;
  double npairs = 0, rank_pairs = 0;
};
Touch touch(const Problem& p, bool with_perm) {
  const auto map = ints(p, "token_lora_mapping"), topk = ints(p, "topk_ids"), rk = ints(p, "lora_ranks");
  const auto perm = with_perm ? ints(p, "expanded_idx_to_permuted_idx") : std::vector<int32_t>{};
  Touch t;
  for (std::size_t i = 0; i < topk.size(); ++i) {
    const int l = map[i / 2], e = topk[i];
    if (l < 0 || e < 0 || e >= 8 || (with_perm && perm[i] < 0)) continue;
    ++t.pairs[{l, e}];
    t.tokens.insert(int64_t(i) / 2);
    t.slots.insert(l);
    t.npairs += 1;
    t.rank_pairs += rk[std::size_t(l)];
  }
  return t;
}

TEST(MoeDeltaFloors, Gemm1WritesEveryRowAndReadsTouchedWeightsAtTrueRank) {
  auto p = make_problem(one("bgmv_moe_gemm1_lora_delta"));
  const Touch t = touch(*p, false);
  const auto rk = ints(*p, "lora_ranks");
  ASSERT_GT(t.npairs, 0);
  ASSERT_LT(t.npairs, 48);  // tokens without an adapter: their rows are written (zeros) but read nothing
  double weights = 0;
  for (const auto& [le, n] : t.pairs) weights += rk[std::size_t(le.first)] * (2 * 72 + 2 * 40) * 2.0;
  const double want = weights + double(t.tokens.size()) * 72 * 2 + 24.0 * 2 * 80 * 2;  // all [T, k, 2I] bf16
  EXPECT_DOUBLE_EQ(p->work().bytes, want);
  EXPECT_DOUBLE_EQ(p->work().flops, 2.0 * t.rank_pairs * (2 * 72 + 80));
  const Baseline bl = p->baseline();
  ASSERT_EQ(bl.grouped.size(), 2u);
  EXPECT_EQ(bl.grouped[0].groups.size(), t.pairs.size());
  EXPECT_FALSE(bl.grouped[1].accumulate);
  for (const auto& g : bl.grouped[1].groups) EXPECT_EQ(g.n, 80);
}

TEST(MoeDeltaFloors, SharedAModeCountsItsOwnSmallerBytes) {
  auto reg = make_problem(one("bgmv_moe_gemm1_lora_delta", R"(, "out_dtype": "fp32")"));
  auto sa = make_problem(one("bgmv_moe_gemm1_lora_delta", R"(, "out_dtype": "fp32", "shared_a": true)"));
  const Touch t = touch(*sa, false);
  const auto rk = ints(*sa, "lora_ranks");
  double weights = 0;
  for (const auto& [le, n] : t.pairs) weights += rk[std::size_t(le.first)] * (72 + 2 * 40) * 2.0;  // one A, B [2I, r]
  EXPECT_DOUBLE_EQ(sa->work().bytes, weights + double(t.tokens.size()) * 72 * 2 + 24.0 * 2 * 80 * 4);
  EXPECT_LT(sa->work().bytes, reg->work().bytes);
  EXPECT_DOUBLE_EQ(sa->work().flops, 2.0 * t.rank_pairs * (72 + 80));
}

TEST(MoeDeltaFloors, StrideZeroExpertsCountWeightsOncePerAdapter) {
  auto p = make_problem(one("bgmv_moe_gemm2_lora_delta", R"(, "shared_lora": true, "inactive_slot_fraction": 0.3)"));
  const Touch t = touch(*p, true);
  const auto rk = ints(*p, "lora_ranks");
  double weights = 0;
  for (int l : t.slots) weights += rk[std::size_t(l)] * (40 + 72) * 2.0;
  // act rows of the active slots, [T, H] bf16 written
  EXPECT_DOUBLE_EQ(p->work().bytes, weights + t.npairs * 40 * 2 + 24.0 * 72 * 2);
  EXPECT_DOUBLE_EQ(p->work().flops, 2.0 * t.rank_pairs * (40 + 72));
  EXPECT_EQ(p->baseline().grouped.at(0).groups.size(), t.pairs.size());
}

}  // namespace
}  // namespace punica::bench
