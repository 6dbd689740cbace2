// MoE LoRA references: the Eigen path against the independent naive fp64 loops (DESIGN §6
// tolerance) for the fused op (w13 gated / non-gated, w2, naive and aligned paths, block sizes
// 16/32/64, fp16/bf16, add_inputs, offset, disabled adapters, -1 tokens, expert_map, out-of-range
// expert ids, mixed ranks, shared LoRA, NaN padding), the split (shrink -> buffer -> expand, also
// emulating the fully-sharded collectives), add_lora_w13 / add_lora_w2, and the alignment against
// the order-free contract of SPEC §4.2 (check_moe_lora_align), which must also catch broken outputs.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <string>
#include <vector>

#include "kernels/common/error.h"
#include "kernels/fused_moe_lora/moe_test_util.h"
#include "reference/moe_reference.h"

using namespace punica;
using kernels::DType;
using namespace kernels::moetest;

namespace {

// Runs the Eigen alignment into p's buffers (naive mode: expert_ids only) and returns the routing.
kernels::MoeLoraRouting align(MoeProblem& p, bool with_naive_loops = false) {
  kernels::MoeLoraAlignArgs a = p.align_args();
  a.sorted_token_ids = p.sorted.data();
  a.expert_ids = p.eids.data();
  a.num_tokens_post_pad = p.ntpp.data();
  if (with_naive_loops) ref::naive::moe_lora_align(a); else ref::moe_lora_align(a);
  kernels::MoeLoraRouting r;
  r.naive = p.c.naive;
  r.block_size = p.c.bs;
  r.max_padded = p.P;
  r.sorted_token_ids = p.sorted.data();
  r.expert_ids = p.eids.data();
  r.num_tokens_post_pad = p.ntpp.data();
  r.lora_ids = p.lora_ids_ptr();
  return r;
}

class Fused : public ::testing::TestWithParam<MoeCase> {};

// The Eigen one call's result `y` on the Eigen alignment's routing, and the same Args on `y_other`
// (a fresh copy of y0) for the path under test.
struct EigenOneCall {
  Tensor y, y_other;
  kernels::FusedMoeLoraArgs a;
};
EigenOneCall eigen_one_call(MoeProblem& p) {
  EigenOneCall out{p.y0, p.y0, {}};
  out.a = p.args(out.y.data());
  out.a.routing = align(p);
  ref::add_lora_fused_moe(out.a);
  out.a.y = out.y_other.data();
  return out;
}

TEST_P(Fused, EigenMatchesNaiveLoopsAndLeavesOthersUntouched) {
  MoeProblem p = make_problem(GetParam());
  auto run = eigen_one_call(p);
  ref::naive::add_lora_fused_moe(run.a);
  const Tensor &ye = run.y, &yn = run.y_other;
  std::string rep;
  EXPECT_EQ(compare_y(ye, yn, p.y0, written_mask(p), rtol_for(p.c.dtype), rep), 0u) << rep;
  std::string rep2;
  EXPECT_EQ(compare_y(yn, ye, p.y0, written_mask(p), rtol_for(p.c.dtype), rep2), 0u) << rep2;
}

TEST_P(Fused, SplitShrinkExpandEqualsOneCall) {
  MoeProblem p = make_problem(GetParam());
  auto run = eigen_one_call(p);
  const Tensor &y1 = run.y, &y2 = run.y_other;
  auto a = run.a;
  Tensor inter(p.c.inter, std::size_t(p.c.S) * p.numel * p.R);
  for (std::size_t i = 0; i < inter.n; ++i) inter.set(i, NAN);
  a.intermediate = inter.data();
  ref::fused_moe_lora_shrink(a);
  for (std::size_t i = 0; i < inter.n; ++i) ASSERT_FALSE(std::isnan(inter.get(i))) << "shrink left " << i << " unwritten";
  ref::fused_moe_lora_expand(a);
  for (std::size_t i = 0; i < y1.n; ++i) ASSERT_EQ(y1.bits(i), y2.bits(i)) << i;
  // And the naive loops' split against their one call.
  Tensor y3 = p.y0, y4 = p.y0;
  a.y = y3.data();
  ref::naive::add_lora_fused_moe(a);
  a.y = y4.data();
  ref::naive::fused_moe_lora_shrink(a);
  ref::naive::fused_moe_lora_expand(a);
  for (std::size_t i = 0; i < y3.n; ++i) ASSERT_EQ(y3.bits(i), y4.bits(i)) << i;
}

TEST_P(Fused, NaNPaddingBeyondTrueRankIsNeverRead) {
  MoeCase c = GetParam();
  c.nan_pad = true;
  MoeProblem pn = make_problem(c);
  c.nan_pad = false;
  MoeProblem pz = make_problem(c);
  const auto rn = align(pn);
  const auto rz = align(pz);
  Tensor yn = pn.y0, yz = pz.y0;
  auto an = pn.args(yn.data());
  an.routing = rn;
  auto az = pz.args(yz.data());
  az.routing = rz;
  ref::add_lora_fused_moe(an);
  ref::add_lora_fused_moe(az);
  for (std::size_t i = 0; i < yn.n; ++i) ASSERT_EQ(yn.bits(i), yz.bits(i)) << i;
  Tensor yn2 = pn.y0;
  an.y = yn2.data();
  ref::naive::add_lora_fused_moe(an);
  std::string rep;
  EXPECT_EQ(compare_y(yn2, yz, pz.y0, written_mask(pz), rtol_for(c.dtype), rep), 0u) << rep;
}

INSTANTIATE_TEST_SUITE_P(Cases, Fused, ::testing::ValuesIn(odd_fused_cases()),
                         [](const auto& i) { return i.param.name; });

// ---------------------------------------------------------------- alignment
std::vector<MoeCase> align_cases() {
  std::vector<MoeCase> v;
  int n = 0;
  for (int bs : {16, 32, 64})
    for (int M : {1, 7, 100, 300})
      for (int variant = 0; variant < 3; ++variant) {
        MoeCase c;
        c.name = "align" + std::to_string(n);
        c.seed = uint64_t(100 + ++n);
        c.M = M;
        c.k = variant == 2 ? 6 : 2;
        c.E = variant == 2 ? 64 : 8;
        c.bs = bs;
        c.ranks = {8, 8, 8, 8};
        c.disabled = variant == 1 ? std::vector<int>{2} : std::vector<int>{};
        c.oor_pct = variant == 1 ? 15 : 0;
        c.expert_map = variant == 1;
        c.lora_ids_mode = variant;
        c.pad_sorted_ids = variant == 2;
        v.push_back(c);
      }
  return v;
}

class Align : public ::testing::TestWithParam<MoeCase> {};

TEST_P(Align, EigenAndNaiveLoopsHoldTheContract) {
  for (bool loops : {false, true}) {
    MoeProblem p = make_problem(GetParam());
    const auto before_s = p.sorted, before_e = p.eids, before_n = p.ntpp;
    align(p, loops);
    auto a = p.align_args();
    EXPECT_EQ(ref::check_moe_lora_align(a, p.sorted.data(), p.eids.data(), p.ntpp.data(), before_s.data(),
                                        before_e.data(), before_n.data()),
              "")
        << (loops ? "naive loops" : "eigen");
  }
}

TEST_P(Align, ContractCatchesBrokenOutputs) {
  MoeProblem p = make_problem(GetParam());
  const auto before_s = p.sorted, before_e = p.eids, before_n = p.ntpp;
  align(p);
  const auto a = p.align_args();
  auto check = [&](const std::vector<int32_t>& s, const std::vector<int32_t>& e, const std::vector<int32_t>& n) {
    return ref::check_moe_lora_align(a, s.data(), e.data(), n.data(), before_s.data(), before_e.data(), before_n.data());
  };
  ASSERT_EQ(check(p.sorted, p.eids, p.ntpp), "");
  // A pair swapped between two groups, a sentinel replaced by a pair, an untouched slot written.
  int l = -1;
  for (int s = 0; s < p.L && l < 0; ++s)
    if (p.ntpp[std::size_t(s)] != 0x7777 && p.ntpp[std::size_t(s)] >= 2 * p.c.bs) l = s;
  if (l >= 0) {
    auto s2 = p.sorted;
    const int64_t base = int64_t(l) * p.P;
    const int64_t other = p.c.bs;  // first position of the second block
    if (s2[std::size_t(base)] != s2[std::size_t(base + other)] && p.eids[std::size_t(int64_t(l) * p.Q)] != p.eids[std::size_t(int64_t(l) * p.Q + 1)]) {
      std::swap(s2[std::size_t(base)], s2[std::size_t(base + other)]);
      if (s2[std::size_t(base)] < p.numel && s2[std::size_t(base + other)] < p.numel) {
        EXPECT_NE(check(s2, p.eids, p.ntpp), "");
      }
    }
    auto n2 = p.ntpp;
    n2[std::size_t(l)] += p.c.bs;
    EXPECT_NE(check(p.sorted, p.eids, n2), "");
    auto e2 = p.eids;
    e2[std::size_t(int64_t(l) * p.Q + p.Q - 1)] = 0;
    if (p.ntpp[std::size_t(l)] / p.c.bs < p.Q) {
      EXPECT_NE(check(p.sorted, e2, p.ntpp), "");
    }
  }
  for (int s = 0; s < p.L; ++s)
    if (p.ntpp[std::size_t(s)] == 0x7777) {  // an unprocessed slot
      auto s2 = p.sorted;
      s2[std::size_t(int64_t(s) * p.P)] = int32_t(p.numel);
      EXPECT_NE(check(s2, p.eids, p.ntpp), "");
    }
}

INSTANTIATE_TEST_SUITE_P(Cases, Align, ::testing::ValuesIn(align_cases()),
                         [](const auto& i) { return i.param.name; });

TEST(Align, HandExample) {
  // M = 3 tokens, k = 2, E = 4, bs = 4; token slots {0, -1, 0}; topk {1,3 | 0,1 | 1,5}: 5 >= E dropped.
  const std::vector<int32_t> topk = {1, 3, 0, 1, 1, 5}, map = {0, -1, 0}, enabled = {1, 1, 0};
  std::vector<int32_t> sorted(2 * 16, -7), eids(2 * 4, -7), ntpp(2, -7);
  kernels::MoeLoraAlignArgs a;
  a.num_tokens = 3;
  a.top_k = 2;
  a.topk_ids = topk.data();
  a.token_lora_mapping = map.data();
  a.num_experts = 4;
  a.block_size = 4;
  a.max_loras = 2;
  a.adapter_enabled = enabled.data();
  a.max_padded = 16;
  a.sorted_token_ids = sorted.data();
  a.expert_ids = eids.data();
  a.num_tokens_post_pad = ntpp.data();
  ref::moe_lora_align(a);
  // slot 0: expert 1 <- pairs {0, 4}, expert 3 <- pair {1}; slot 1 enabled but has no token.
  EXPECT_EQ(ntpp[0], 8);
  EXPECT_EQ((std::vector<int32_t>(sorted.begin(), sorted.begin() + 16)),
            (std::vector<int32_t>{0, 4, 6, 6, 1, 6, 6, 6, 6, 6, 6, 6, 6, 6, 6, 6}));
  EXPECT_EQ((std::vector<int32_t>(eids.begin(), eids.begin() + 4)), (std::vector<int32_t>{1, 3, -1, -1}));
  EXPECT_EQ(ntpp[1], 0);
  EXPECT_EQ(eids[4], -1);
  EXPECT_EQ(sorted[16], 6);
}

TEST(Align, NaiveModeGivesLocalExperts) {
  MoeCase c;
  c.name = "naive_align";
  c.naive = true;
  c.expert_map = true;
  c.oor_pct = 20;
  MoeProblem p = make_problem(c);
  align(p);
  auto a = p.align_args();
  EXPECT_EQ(ref::check_moe_lora_align(a, nullptr, p.eids.data(), nullptr, nullptr, nullptr, nullptr), "");
  std::vector<int32_t> e2(p.eids.size(), 0);
  a.expert_ids = e2.data();
  ref::naive::moe_lora_align(a);
  for (int64_t i = 0; i < p.numel; ++i) EXPECT_EQ(e2[std::size_t(i)], p.eids[std::size_t(i)]);
}

// ---------------------------------------------------------------- sharded split (host collectives)
TEST(Sharded, W13RankSlicesAllGatheredEqualUnsharded) {
  MoeCase c;
  c.name = "sharded_w13";
  c.ranks = {16, 16, 16};  // fully sharded layers need r % tp == 0 (true ranks here all = r)
  c.K = 72;
  c.N = 24;
  c.dtype = c.inter = DType::bf16;
  MoeProblem p = make_problem(c);
  const auto full = eigen_one_call(p);
  const Tensor& yfull = full.y;
  auto a = full.a;
  const int tp = 2, rl = p.R / tp;
  Tensor gathered(c.inter, std::size_t(c.S) * p.numel * p.R);
  for (int rho = 0; rho < tp; ++rho) {
    // A's rank slice of this rank: rows [rho*rl, (rho+1)*rl) of every (slot, expert).
    std::vector<Tensor> As;
    for (int s = 0; s < c.S; ++s) As.push_back(rank_slice_a(p, s, rho, rl));
    Tensor part(c.inter, std::size_t(c.S) * p.numel * rl);
    auto sa = a;
    for (int s = 0; s < c.S; ++s) sa.lora_a[s] = As[std::size_t(s)].data();
    sa.a_rank = rl;
    sa.a_rank_offset = rho * rl;
    sa.intermediate = part.data();
    ref::fused_moe_lora_shrink(sa);
    for (int64_t row = 0; row < c.S * p.numel; ++row)  // all-gather along the rank dim
      for (int j = 0; j < rl; ++j) gathered.set(std::size_t(row) * p.R + rho * rl + j, part.get(std::size_t(row) * rl + j));
  }
  Tensor ysplit = p.y0;
  auto ea = a;
  ea.y = ysplit.data();
  ea.intermediate = gathered.data();
  ref::fused_moe_lora_expand(ea);
  for (std::size_t i = 0; i < yfull.n; ++i) ASSERT_EQ(yfull.bits(i), ysplit.bits(i)) << i;
}

TEST(Sharded, W2InputSlicesAllReducedEqualUnsharded) {
  MoeCase c;
  c.name = "sharded_w2";
  c.w2 = true;
  c.S = 1;
  c.ranks = {16, 8, 16};
  c.K = 48;  // I
  c.N = 40;  // H
  c.dtype = c.inter = DType::bf16;
  MoeProblem p = make_problem(c);
  const auto r = align(p);
  Tensor yfull = p.y0;
  auto a = p.args(yfull.data());
  a.routing = r;
  ref::naive::add_lora_fused_moe(a);
  const int tp = 2;
  const int64_t Il = c.K / tp, Hl = c.N / tp;
  Tensor sum(DType::f32, std::size_t(p.numel) * p.R);
  for (int rho = 0; rho < tp; ++rho) {
    Tensor As(c.dtype, std::size_t(p.L) * c.E * p.R * Il), xs(c.dtype, std::size_t(p.numel) * Il);
    for (std::size_t row = 0; row < std::size_t(p.L) * c.E * p.R; ++row)
      for (int64_t kk = 0; kk < Il; ++kk) As.set(row * Il + kk, p.A[0].get(row * c.K + rho * Il + kk));
    for (int64_t row = 0; row < p.numel; ++row)
      for (int64_t kk = 0; kk < Il; ++kk) xs.set(std::size_t(row * Il + kk), p.x.get(std::size_t(row * c.K + rho * Il + kk)));
    Tensor part(DType::f32, std::size_t(p.numel) * p.R);
    auto sa = a;
    sa.intermediate_dtype = DType::f32;
    sa.lora_a[0] = As.data();
    sa.x = xs.data();
    sa.hidden = Il;
    sa.x_row_stride = Il;
    sa.intermediate = part.data();
    ref::naive::fused_moe_lora_shrink(sa);
    for (std::size_t i = 0; i < sum.n; ++i) sum.set(i, sum.get(i) + part.get(i));  // all-reduce
  }
  // Each rank's expand writes its H/tp columns of B at offset rho*H/tp; together the full width.
  Tensor ysplit = p.y0;
  for (int rho = 0; rho < tp; ++rho) {
    Tensor Bs(c.dtype, std::size_t(p.L) * c.E * Hl * p.R);
    for (std::size_t le = 0; le < std::size_t(p.L) * c.E; ++le)
      for (int64_t n = 0; n < Hl; ++n)
        for (int j = 0; j < p.R; ++j) Bs.set((le * Hl + n) * p.R + j, p.B[0].get((le * c.N + rho * Hl + n) * p.R + j));
    auto ea = a;
    ea.intermediate_dtype = DType::f32;
    ea.intermediate = sum.data();
    ea.lora_b[0] = Bs.data();
    ea.slice_width = Hl;
    ea.offset = c.offset + rho * Hl;
    ea.y = ysplit.data();
    ref::naive::fused_moe_lora_expand(ea);
  }
  std::string rep;
  EXPECT_EQ(compare_y(ysplit, yfull, p.y0, written_mask(p), rtol_for(c.dtype), rep), 0u) << rep;
}

// ---------------------------------------------------------------- add_lora_w13 / add_lora_w2
TEST(W13W2, PathRuleRoutingReuseAndNaiveLoops) {
  for (int M : {2, 64}) {  // 2*4*8 <= 16*5: naive; 64*4*8 > 80: aligned
    for (bool emap : {false, true}) {
      const MoeCase c = w13_case("w13w2_" + std::to_string(M) + std::to_string(emap), M, emap, 40, 24, 2, 16);
      MoeProblem p = make_problem(c);
      kernels::AddLoraW13Args w;
      Tensor ye = p.y0, yn = p.y0;
      w.op = p.args(ye.data());
      w.topk_ids = p.topk.data();
      w.expert_map = emap ? p.emap.data() : nullptr;
      w.num_experts_global = p.Eg;
      w.block_size = c.bs;
      w.lora_ids = p.lora_ids_ptr();
      w.sorted_token_ids = p.sorted.data();
      w.expert_ids = p.eids.data();
      w.num_tokens_post_pad = p.ntpp.data();
      const auto r = ref::add_lora_w13(w);
      EXPECT_EQ(r.naive, M == 2 && !emap) << c.name;
      std::vector<int32_t> s2(p.sorted.size()), e2(p.eids.size()), n2(p.ntpp.size());
      w.op.y = yn.data();
      w.sorted_token_ids = s2.data();
      w.expert_ids = e2.data();
      w.num_tokens_post_pad = n2.data();
      const auto rn = ref::naive::add_lora_w13(w);
      EXPECT_EQ(rn.naive, r.naive);
      EXPECT_EQ(w13_w2_mismatch(ye, yn, p, r.naive), "");
      // w2 on the returned routing: x = [M*k, I] pairs, B [L, E, H, r], weighted.
      const MoeProblem p2 = w2_problem_after(p);
      Tensor y2e = p2.y0, y2n = p2.y0;
      auto a2 = p2.args(y2e.data());
      a2.routing = r;
      ref::add_lora_w2(a2);
      a2.y = y2n.data();
      a2.routing = rn;
      ref::naive::add_lora_w2(a2);
      EXPECT_EQ(w13_w2_mismatch(y2e, y2n, p2, r.naive), "");
    }
  }
}

TEST(Validation, BadArgumentsThrowUsage) {
  MoeCase c;
  MoeProblem p = make_problem(c);
  const auto r = align(p);
  Tensor y = p.y0;
  auto a = p.args(y.data());
  a.routing = r;
  auto bad = a;
  bad.dtype = DType::f32;
  EXPECT_THROW(ref::add_lora_fused_moe(bad), Error);
  bad = a;
  bad.a_rank = p.R / 2;
  EXPECT_THROW(ref::add_lora_fused_moe(bad), Error);  // sharded A needs the split
  bad = a;
  std::vector<int32_t> ranks = p.ranks;
  ranks[0] = p.R + 1;
  bad.lora_ranks = ranks.data();
  EXPECT_THROW(ref::add_lora_fused_moe(bad), Error);
  auto al = p.align_args();
  al.num_experts = 2000;
  EXPECT_THROW(ref::moe_lora_align(al), Error);
}

TEST(Timing, ModelSizedUnderSeconds) {
  MoeCase c;
  c.name = "timing";
  c.M = 64;
  c.k = 8;
  c.E = 32;
  c.K = 2048;
  c.N = 768;
  c.ranks = {16, 16, 16, 16};
  MoeProblem p = make_problem(c);
  const auto r = align(p);
  Tensor y = p.y0;
  auto a = p.args(y.data());
  a.routing = r;
  const auto t0 = std::chrono::steady_clock::now();
  ref::add_lora_fused_moe(a);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("eigen fused MoE LoRA M=64 k=8 H=2048 I=768 r=16: %.3f s\n", s);
  EXPECT_LT(s, 10.0);
}

}  // namespace
