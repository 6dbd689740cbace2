// The MoE entries' floor, cuBLAS baseline and order-free check (issue 44; README, "Floors and
// baselines"): weights at each adapter's true rank over the (adapter, expert) pairs the batch
// touches; x and y rows only for pairs with an enabled adapter and a valid local expert; grouped
// GEMMs per touched (adapter, expert); the alignment checked by its contract, not by positions.
#include <gtest/gtest.h>

#include <cstring>
#include <set>
#include <string>
#include <vector>

#include "apps/punica-bench/problem.h"
#include "apps/punica-bench/scenario.h"
#include "reference/moe_reference.h"

namespace punica::bench {
namespace {

Case one(const std::string& op, const std::string& extra = "") {
  const std::string text = R"({"schema": "punica-bench.scenario/1", "name": "w", "defaults": {}, "cases": [
      {"name": "w", "op": ")" + op + R"(", "hidden": 72, "num_experts": 16, "top_k": 4, "max_loras": 4,
       "num_adapters": 3, "ranks": [16, 8, 5], "max_rank": 16, "num_requests": 24, "no_lora_fraction": 0.25,
       "disabled_adapters": 1, "oob_expert_fraction": 0.1, "expert_map": "half_local", "seed": 3)" +
                           extra + "}]}";
  return parse_scenario(text, "mem.json").cases.at(0);
}

const HostTensor& tensor(const Problem& p, const std::string& name) {
  for (const auto& t : p.tensors)
    if (t.name == name) return t;
  throw std::runtime_error("no tensor " + name);
}
std::vector<int32_t> ints(const Problem& p, const std::string& name) {
  const HostTensor& t = tensor(p, name);
  std::vector<int32_t> v(t.numel());
  std::memcpy(v.data(), t.data.data(), t.bytes());
  return v;
}

// The touched (slot, local expert) pairs counted from the problem's own routing tensors.
struct Touch {
  std::map<std::pair<int, int>, int64_t> pairs;
  std::set<int64_t> tokens;
  double npairs = 0, rank_pairs = 0;
};
Touch touch(const Problem& p, int k, int E_global) {
  const auto map = ints(p, "token_lora_mapping"), topk = ints(p, "topk_ids"), en = ints(p, "adapter_enabled"),
             rk = ints(p, "lora_ranks");
  Touch t;
  for (std::size_t i = 0; i < topk.size(); ++i) {
    const int l = map[i / std::size_t(k)], g = topk[i];
    if (l < 0 || !en[std::size_t(l)] || g < 0 || g >= E_global || g % 2) continue;  // half_local: odd ids elsewhere
    ++t.pairs[{l, g / 2}];
    t.tokens.insert(int64_t(i) / k);
    t.npairs += 1;
    t.rank_pairs += rk[std::size_t(l)];
  }
  return t;
}

TEST(MoeFloors, W13CountsTouchedAdapterExpertPairsAtTrueRanks) {
  const Case c = one("add_lora_w13", R"(, "moe_intermediate": 56)");
  auto p = make_problem(c);
  const Touch t = touch(*p, 4, 16);
  const auto rk = ints(*p, "lora_ranks");
  ASSERT_GT(t.npairs, 0);
  ASSERT_LT(t.npairs, 24 * 4);  // some pairs carry no LoRA term (no adapter, disabled, oob, non-local)
  double weights = 0;
  for (const auto& [le, n] : t.pairs) weights += rk[std::size_t(le.first)] * (2 * 72 + 2 * 56) * 2.0;
  // gated: 2 slices; bf16; x rows = the distinct tokens with a live pair; y read and written
  const double want = weights + double(t.tokens.size()) * 72 * 2 + 2 * t.npairs * 2 * 56 * 2;
  EXPECT_DOUBLE_EQ(p->work().bytes, want);
  EXPECT_DOUBLE_EQ(p->work().flops, 2.0 * t.rank_pairs * (2 * 72 + 2 * 56));

  const Baseline bl = p->baseline();
  ASSERT_EQ(bl.grouped.size(), 2u);
  EXPECT_FALSE(bl.grouped[0].accumulate);
  EXPECT_TRUE(bl.grouped[1].accumulate);
  EXPECT_EQ(bl.grouped[0].groups.size(), t.pairs.size());      // one shrink per touched (adapter, expert)
  EXPECT_EQ(bl.grouped[1].groups.size(), 2 * t.pairs.size());  // one expand per slice
  for (const auto& g : bl.grouped[1].groups) EXPECT_EQ(g.n, 56);
}

TEST(MoeFloors, W2ReadsPairRowsAndWritesOnlyWhenNotAccumulating) {
  const Case c = one("add_lora_w2", R"(, "moe_intermediate": 56, "add_inputs": false, "offset_start": 8)");
  auto p = make_problem(c);
  const Touch t = touch(*p, 4, 16);
  const auto rk = ints(*p, "lora_ranks");
  double weights = 0;
  for (const auto& [le, n] : t.pairs) weights += rk[std::size_t(le.first)] * (56 + 72) * 2.0;
  const double want = weights + t.npairs * 56 * 2 + t.npairs * 72 * 2;  // x per pair, y written once
  EXPECT_DOUBLE_EQ(p->work().bytes, want);
  EXPECT_FALSE(p->baseline().grouped.at(1).accumulate);
}

TEST(MoeFloors, SharedLoraCountsTheSharedSideOncePerAdapter) {
  const Case c = one("add_lora_w13", R"(, "moe_intermediate": 56, "shared_lora": true, "gated": false)");
  auto p = make_problem(c);
  const Touch t = touch(*p, 4, 16);
  const auto rk = ints(*p, "lora_ranks");
  std::set<int> slots;
  double weights = 0;
  for (const auto& [le, n] : t.pairs) {
    weights += rk[std::size_t(le.first)] * 56 * 2.0;  // B per (adapter, expert)
    slots.insert(le.first);
  }
  for (int l : slots) weights += rk[std::size_t(l)] * 72 * 2.0;  // A once per adapter
  EXPECT_DOUBLE_EQ(p->work().bytes, weights + double(t.tokens.size()) * 72 * 2 + 2 * t.npairs * 56 * 2);
}

// The alignment's check is the order-free contract: a permutation inside a group passes, a wrong
// count fails (and the runner counts it in nwrong).
TEST(MoeAlignCheck, OrderInsideAGroupIsFreeAWrongCountIsNot) {
  const Case c = one("moe_lora_align", R"(, "naive": "aligned", "num_requests": 64, "expert_map": "none")");
  auto p = make_problem(c);
  std::vector<std::vector<uint8_t>> buf;
  for (const auto& t : p->tensors) buf.push_back(t.role == Role::scratch ? std::vector<uint8_t>(t.bytes(), 0) : t.data);
  std::vector<void*> ptr;
  for (auto& b : buf) ptr.push_back(b.data());
  p->reference(ptr, false);
  std::vector<const void*> cptr(ptr.begin(), ptr.end());
  auto ok = p->custom_check(cptr, cptr);
  ASSERT_TRUE(ok.has_value());
  EXPECT_EQ(ok->nwrong, 0u) << (ok->failures.empty() ? "" : ok->failures[0]);
  EXPECT_GT(ok->nelems, 0u);

  int si = -1, ni = -1;
  for (std::size_t i = 0; i < p->tensors.size(); ++i) {
    if (p->tensors[i].name == "sorted_token_ids") si = int(i);
    if (p->tensors[i].name == "num_tokens_post_pad") ni = int(i);
  }
  ASSERT_GE(si, 0);
  ASSERT_GE(ni, 0);
  const int64_t numel = 64 * 4;
  // Reverse the real entries of the first non-trivial group (same block: same expert).
  auto* s = reinterpret_cast<int32_t*>(buf[std::size_t(si)].data());
  const auto* ntpp = reinterpret_cast<const int32_t*>(buf[std::size_t(ni)].data());
  const auto en = ints(*p, "adapter_enabled");
  const int64_t P = int64_t(tensor(*p, "sorted_token_ids").numel()) / 4;
  bool swapped = false;
  for (int l = 0; l < 4 && !swapped; ++l) {
    if (!en[std::size_t(l)] || ntpp[l] == 0x77777777) continue;
    int32_t* row = s + l * P;
    for (int64_t b = 0; b + 1 < ntpp[l] && !swapped; b += 16)
      if (row[b] < numel && row[b + 1] < numel) {
        std::swap(row[b], row[b + 1]);
        swapped = true;
      }
  }
  ASSERT_TRUE(swapped);
  auto perm = p->custom_check(cptr, cptr);
  EXPECT_EQ(perm->nwrong, 0u) << perm->failures[0];

  auto* n = reinterpret_cast<int32_t*>(buf[std::size_t(ni)].data());
  for (int l = 0; l < 4; ++l)
    if (en[std::size_t(l)] && n[l] != 0x77777777) {
      n[l] += 16;
      break;
    }
  auto bad = p->custom_check(cptr, cptr);
  EXPECT_EQ(bad->nwrong, 2u);  // the op's result and the reference's (the same buffers here)
}

}  // namespace
}  // namespace punica::bench
