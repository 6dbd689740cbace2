// The floors and baselines of the registry entries (README, "Floors and baselines"): the bytes an op
// must move count only the rows of tokens that have an adapter and the weights of the adapters the
// batch uses at their true ranks; an accumulating op's cuBLAS baselines accumulate; an op made of
// two halves has a baseline of both halves.
#include <gtest/gtest.h>

#include <string>

#include "apps/punica-bench/problem.h"
#include "apps/punica-bench/scenario.h"

namespace punica::bench {
namespace {

Case one(const std::string& op, const std::string& extra = "") {
  const std::string text = R"({"schema": "punica-bench.scenario/1", "name": "w", "defaults": {}, "cases": [
      {"name": "w", "op": ")" + op + R"(", "hidden": 256, "slices": [128, 64], "vocab": 512, "max_loras": 6,
       "num_adapters": 4, "ranks": [8, 16], "max_rank": 16, "num_requests": 64, "tokens_per_request": 2,
       "no_lora_fraction": 0.25, "seed": 3)" + extra + "}]}";
  Scenario s = parse_scenario(text, "mem.json");
  return s.cases.at(0);
}

struct Batch {
  double lora_tokens = 0, all_tokens = 0, sum_rank = 0;  // sum_rank over the adapters the batch uses
};
Batch batch_of(const Case& c) {
  BatchLayout lay = make_layout(c);
  Batch b;
  std::vector<char> used(std::size_t(c.max_loras), 0);
  for (int32_t s : lay.token_slot) {
    b.all_tokens += 1;
    if (s >= 0) {
      b.lora_tokens += 1;
      used[std::size_t(s)] = 1;
    }
  }
  for (int l = 0; l < c.max_loras; ++l)
    if (used[std::size_t(l)]) b.sum_rank += lay.slot_rank[std::size_t(l)];
  return b;
}

TEST(Floors, ShrinkCountsOnlyTokensWithAnAdapter) {
  const Case c = one("lora_shrink");
  const Batch b = batch_of(c);
  ASSERT_GT(b.all_tokens, b.lora_tokens);  // the case has tokens without an adapter
  ASSERT_GT(b.lora_tokens, 0);
  // S A slices at true ranks (bf16) + x rows with an adapter (bf16) + fp32 [S, T_lora, r] written
  const double want = 2 * b.sum_rank * 256 * 2 + b.lora_tokens * 256 * 2 + 2 * b.lora_tokens * 16 * 4;
  EXPECT_DOUBLE_EQ(make_problem(c)->work().bytes, want);
}

TEST(Floors, ExpandReadsAndWritesOnlyRowsWithAnAdapter) {
  const Case c = one("lora_expand");
  const Batch b = batch_of(c);
  const double sumN = 192;
  const double want = b.sum_rank * sumN * 2 + 2 * b.lora_tokens * 16 * 4 + 2 * b.lora_tokens * sumN * 2;
  EXPECT_DOUBLE_EQ(make_problem(c)->work().bytes, want);
  const Case w = one("lora_expand", R"(, "add_inputs": false)");
  EXPECT_DOUBLE_EQ(make_problem(w)->work().bytes, want - b.lora_tokens * sumN * 2);  // y only written
}

TEST(Floors, AddLoraLinearHasNoIntermediateRoundTrip) {
  const Case c = one("add_lora_linear");
  const Batch b = batch_of(c);
  const double sumN = 192;
  const double want = 2 * b.sum_rank * 256 * 2 + b.lora_tokens * 256 * 2 + b.sum_rank * sumN * 2 +
                      2 * b.lora_tokens * sumN * 2;
  EXPECT_DOUBLE_EQ(make_problem(c)->work().bytes, want);
}

TEST(Baselines, AccumulatingOpsAccumulateAndTwoHalvesTimeBoth) {
  Baseline shrink = make_problem(one("lora_shrink"))->baseline();
  ASSERT_EQ(shrink.dense.size(), 1u);
  EXPECT_FALSE(shrink.dense[0].accumulate);  // the shrink writes its output

  Baseline expand = make_problem(one("lora_expand"))->baseline();
  ASSERT_EQ(expand.dense.size(), 1u);
  EXPECT_TRUE(expand.dense[0].accumulate);  // add_inputs: y is read and written, beta = 1
  ASSERT_EQ(expand.grouped.size(), 1u);
  EXPECT_TRUE(expand.grouped[0].accumulate);
  EXPECT_FALSE(make_problem(one("lora_expand", R"(, "add_inputs": false)"))->baseline().dense[0].accumulate);

  Baseline linear = make_problem(one("add_lora_linear"))->baseline();
  ASSERT_EQ(linear.dense.size(), 2u);
  ASSERT_EQ(linear.grouped.size(), 2u);  // the shrink's grouped call and the expand's
  EXPECT_FALSE(linear.grouped[0].accumulate);
  EXPECT_TRUE(linear.grouped[1].accumulate);
  // the expand half's groups: N = the slices' width, K = each adapter's true rank
  for (const auto& g : linear.grouped[1].groups) {
    EXPECT_EQ(g.n, 192);
    EXPECT_TRUE(g.k == 8 || g.k == 16) << g.k;
  }

  Baseline logits = make_problem(one("add_lora_logits"))->baseline();
  ASSERT_EQ(logits.grouped.size(), 2u);
  EXPECT_TRUE(logits.dense.back().accumulate);
}

}  // namespace
}  // namespace punica::bench
