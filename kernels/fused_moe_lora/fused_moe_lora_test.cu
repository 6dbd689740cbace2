// GPU test of add_lora_fused_moe (one call and the shrink -> buffer -> expand split, also with a
// rank-sliced A as the fully-sharded w13 has), add_lora_w13 / add_lora_w2, against the Eigen
// reference (DESIGN §6 tolerance on written elements, bit-equality elsewhere): outputs poisoned
// (NaN when add_inputs=false, random y0 otherwise), guard regions, NaN padding beyond the true ranks,
// the odd-shape grid (moetest::odd_fused_cases) and vLLM's matrix (SPEC §6.3).
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "kernels/fused_moe_lora/fused_moe_lora.h"
#include "kernels/fused_moe_lora/moe_gpu_test_util.h"
#include "kernels/common/test_util.h"
#include "reference/moe_reference.h"

namespace punica::kernels {
namespace {
using namespace moetest;

// add_lora_w13's routing buffers and output on the device, and its Args over a DeviceProblem.
struct W13Buffers {
  GuardedBuf s, e, n, y;
  explicit W13Buffers(const MoeProblem& p) : s(guarded(p.sorted)), e(guarded(p.eids)), n(guarded(p.ntpp)), y(guarded(p.y0)) {}
  AddLoraW13Args args(const MoeProblem& p, const DeviceProblem& d) const {
    AddLoraW13Args w;
    w.op = d.args(p, y.ptr());
    w.topk_ids = d.topk.as<int32_t>();
    w.expert_map = p.c.expert_map ? d.emap.as<int32_t>() : nullptr;
    w.num_experts_global = p.Eg;
    w.block_size = p.c.bs;
    w.pad_sorted_ids = p.c.pad_sorted_ids;
    w.lora_ids = d.lora_ids.as<int32_t>();
    w.sorted_token_ids = s.as<int32_t>();
    w.expert_ids = e.as<int32_t>();
    w.num_tokens_post_pad = n.as<int32_t>();
    return w;
  }
};

// The routing on the device (alignment kernel, or its naive mode) and, for the reference, on the host.
struct Routing {
  GuardedBuf s, e, n;
  MoeLoraRouting dev, host;
};
void make_routing(MoeProblem& p, const DeviceProblem& d, Routing& r) {
  r.s = guarded(p.sorted);
  r.e = guarded(p.eids);
  r.n = guarded(p.ntpp);
  MoeLoraAlignArgs a = d.align_args(p);
  a.sorted_token_ids = r.s.as<int32_t>();
  a.expert_ids = r.e.as<int32_t>();
  a.num_tokens_post_pad = r.n.as<int32_t>();
  launch_moe_lora_align(a, nullptr);
  MoeLoraAlignArgs h = p.align_args();
  h.sorted_token_ids = p.sorted.data();
  h.expert_ids = p.eids.data();
  h.num_tokens_post_pad = p.ntpp.data();
  ref::moe_lora_align(h);
  for (MoeLoraRouting* x : {&r.dev, &r.host}) {
    x->naive = p.c.naive;
    x->block_size = p.c.bs;
    x->max_padded = p.P;
  }
  r.dev.sorted_token_ids = r.s.as<int32_t>();
  r.dev.expert_ids = r.e.as<int32_t>();
  r.dev.num_tokens_post_pad = r.n.as<int32_t>();
  r.dev.lora_ids = p.c.lora_ids_mode == 0 ? nullptr : d.lora_ids.as<int32_t>();
  r.host.sorted_token_ids = p.sorted.data();
  r.host.expert_ids = p.eids.data();
  r.host.num_tokens_post_pad = p.ntpp.data();
  r.host.lora_ids = p.lora_ids_ptr();
}

Tensor download_y(const GuardedBuf& g, const Tensor& like, const char* what) {
  Tensor t = like;
  EXPECT_TRUE(g.download(t.data())) << what << ": guard region overwritten";
  return t;
}

void run_fused_case(const MoeCase& c, bool split = true) {
  SCOPED_TRACE(c.name);
  MoeProblem p = make_problem(c);
  DeviceProblem d(p);
  Routing r;
  make_routing(p, d, r);
  // Reference (host routing) and the one-call GPU op (device routing).
  Tensor yref = p.y0;
  FusedMoeLoraArgs h = p.args(yref.data());
  h.routing = r.host;
  ref::add_lora_fused_moe(h);
  GuardedBuf gy = guarded(p.y0);
  FusedMoeLoraArgs a = d.args(p, gy.ptr());
  a.routing = r.dev;
  launch_add_lora_fused_moe(a, nullptr);
  PUNICA_CUDA_CHECK(cudaDeviceSynchronize());
  const Tensor got = download_y(gy, p.y0, "y");
  const auto written = written_mask(p);
  std::string rep;
  EXPECT_EQ(compare_y(got, yref, p.y0, written, rtol_for(c.dtype), rep), 0u) << rep;
  EXPECT_TRUE(d.inputs_intact()) << "an input buffer's guard changed";
  {
    // One call through the scratch (row/K-split shrink or the split-K mma shrink, then the
    // column-tiled expand); the K split sums in another order, so against the reference.
    Tensor ws = scratch_tensor(p);
    GuardedBuf gw = guarded(ws), gy3 = guarded(p.y0);
    FusedMoeLoraArgs a3 = a;
    a3.intermediate = gw.ptr();
    a3.y = gy3.ptr();
    launch_add_lora_fused_moe(a3, nullptr);
    PUNICA_CUDA_CHECK(cudaDeviceSynchronize());
    EXPECT_TRUE(gw.download(ws.data())) << "scratch guard";
    const Tensor got3 = download_y(gy3, p.y0, "y (scratch)");
    std::string rep3;
    EXPECT_EQ(compare_y(got3, yref, p.y0, written, rtol_for(c.dtype), rep3), 0u) << "one call with scratch:" << rep3;
  }
  if (!split) return;
  // Split: shrink overwrites the whole (NaN-poisoned) buffer; then expand gives the one call's y.
  Tensor inter(c.inter, std::size_t(c.S) * p.numel * p.R);
  for (std::size_t i = 0; i < inter.n; ++i) inter.set(i, NAN);
  GuardedBuf gi = guarded(inter), gy2 = guarded(p.y0);
  a.intermediate = gi.ptr();
  a.y = gy2.ptr();
  launch_fused_moe_lora_shrink(a, nullptr);
  launch_fused_moe_lora_expand(a, nullptr);
  PUNICA_CUDA_CHECK(cudaDeviceSynchronize());
  Tensor gint = inter;
  EXPECT_TRUE(gi.download(gint.data())) << "intermediate guard";
  Tensor rint = inter;
  h.intermediate = rint.data();
  ref::fused_moe_lora_shrink(h);
  std::vector<uint8_t> all(inter.n, 1);
  std::string rep2;
  EXPECT_EQ(compare_y(gint, rint, rint, all, rtol_for(c.inter == DType::f32 ? c.dtype : c.inter), rep2), 0u)
      << "intermediate:" << rep2;
  const Tensor got2 = download_y(gy2, p.y0, "y (split)");
  std::string rep4;  // the shrink's K split may sum in another order than the one call
  EXPECT_EQ(compare_y(got2, yref, p.y0, written, rtol_for(c.dtype), rep4), 0u) << "split:" << rep4;
}

class FusedMoeLoraOdd : public ::testing::TestWithParam<MoeCase> {};
TEST_P(FusedMoeLoraOdd, MatchesReference) { run_fused_case(GetParam()); }
TEST_P(FusedMoeLoraOdd, NaNPaddingBeyondTrueRank) {
  MoeCase c = GetParam();
  c.nan_pad = true;
  c.name += "_nanpad";
  run_fused_case(c);
}
INSTANTIATE_TEST_SUITE_P(Cases, FusedMoeLoraOdd, ::testing::ValuesIn(odd_fused_cases()),
                         [](const auto& i) { return i.param.name; });

// vLLM tests/lora/test_fused_moe_lora_kernel.py (SPEC §6.3): T 100, top_k {6, 12}, E 64,
// max_loras {4, 6, 16}, N 1408, K 2048, r {16, 32, 64}, block 16, fp16/bf16, mul_routed_weight F/T;
// every token has an adapter. Plus the fp32 intermediate (the dense ops' buffer choice).
std::vector<MoeCase> vllm_cases() {
  std::vector<MoeCase> v;
  int n = 0;
  for (int k : {6, 12})
    for (int R : {16, 32, 64})
      for (DType dt : {DType::f16, DType::bf16})
        for (bool mul : {false, true}) {
          MoeCase c;
          const int L = (n % 3 == 0) ? 4 : (n % 3 == 1) ? 6 : 16;
          c.name = "vllm_k" + std::to_string(k) + "_r" + std::to_string(R) + "_L" + std::to_string(L) + "_" +
                   dtype_name(dt) + (mul ? "_w2" : "_w13");
          c.seed = uint64_t(1000 + ++n);
          c.M = 100;
          c.k = k;
          c.E = 64;
          c.K = 2048;
          c.N = 1408;
          c.S = 1;
          c.w2 = mul;
          c.ranks.assign(std::size_t(L), R);
          c.dtype = c.inter = dt;
          c.none_pct = 0;
          c.bs = 16;
          c.disabled = {};
          c.lora_ids_mode = 1;
          v.push_back(c);
        }
  MoeCase f = v.front();
  f.name = "vllm_fp32_intermediate";
  f.inter = DType::f32;
  v.push_back(f);
  return v;
}
class FusedMoeLoraVllm : public ::testing::TestWithParam<MoeCase> {};
TEST_P(FusedMoeLoraVllm, MatchesReference) { run_fused_case(GetParam(), /*split=*/GetParam().k == 6); }
INSTANTIATE_TEST_SUITE_P(Matrix, FusedMoeLoraVllm, ::testing::ValuesIn(vllm_cases()),
                         [](const auto& i) { return i.param.name; });

// Fully-sharded w13 shrink: this rank holds A's rank rows [rho*r/2, (rho+1)*r/2); mixed true ranks
// make some adapters' local rank partial or zero.
TEST(FusedMoeLoraSplit, RankSlicedShrinkMatchesReference) {
  MoeCase c;
  c.name = "sharded_w13";
  c.ranks = {16, 8, 12, 0, 16};
  c.K = 136;
  c.N = 40;
  c.bs = 32;
  for (int rho = 0; rho < 2; ++rho) {
    SCOPED_TRACE(rho);
    MoeProblem p = make_problem(c);
    const int rl = p.R / 2;
    for (int s = 0; s < c.S; ++s) p.A[std::size_t(s)] = rank_slice_a(p, s, rho, rl);
    DeviceProblem d(p);
    Routing r;
    make_routing(p, d, r);
    Tensor inter(c.inter, std::size_t(c.S) * p.numel * rl);
    for (std::size_t i = 0; i < inter.n; ++i) inter.set(i, NAN);
    GuardedBuf gi = guarded(inter);
    FusedMoeLoraArgs a = d.args(p, nullptr);
    a.routing = r.dev;
    a.a_rank = rl;
    a.a_rank_offset = rho * rl;
    a.intermediate = gi.ptr();
    launch_fused_moe_lora_shrink(a, nullptr);
    PUNICA_CUDA_CHECK(cudaDeviceSynchronize());
    Tensor got = inter, want = inter;
    EXPECT_TRUE(gi.download(got.data()));
    FusedMoeLoraArgs h = p.args(nullptr);
    h.routing = r.host;
    h.a_rank = rl;
    h.a_rank_offset = rho * rl;
    h.intermediate = want.data();
    ref::fused_moe_lora_shrink(h);
    std::vector<uint8_t> all(inter.n, 1);
    std::string rep;
    EXPECT_EQ(compare_y(got, want, want, all, rtol_for(c.inter), rep), 0u) << rep;
  }
}

// add_lora_w13 then add_lora_w2 on the routing it returns; the path (naive vs aligned) recorded.
TEST(AddLoraW13W2, PathRuleAndRoutingReuse) {
  for (int M : {2, 64, 300})
    for (bool emap : {false, true})
      for (int S : {2, 1}) {
        const MoeCase c = w13_case("w13_M" + std::to_string(M) + (emap ? "_emap" : "") + "_S" + std::to_string(S), M,
                                   emap, 200, 56, S, 32);
        SCOPED_TRACE(c.name);
        MoeProblem p = make_problem(c);
        DeviceProblem d(p);
        W13Buffers wb(p);
        const AddLoraW13Args w = wb.args(p, d);
        GuardedBuf& gy = wb.y;
        const MoeLoraRouting r = launch_add_lora_w13(w, nullptr);
        EXPECT_EQ(r.naive, moe_lora_use_naive(M, c.k, c.E, p.L, emap));
        EXPECT_EQ(r.naive, M == 2 && !emap);
        // Reference on host copies of the same inputs.
        Tensor yref = p.y0;
        AddLoraW13Args hw = w;
        hw.op = p.args(yref.data());
        hw.topk_ids = p.topk.data();
        hw.expert_map = emap ? p.emap.data() : nullptr;
        hw.lora_ids = p.lora_ids.data();
        std::vector<int32_t> hs(p.sorted.size()), he(p.eids.size()), hn(p.ntpp.size());
        hw.sorted_token_ids = hs.data();
        hw.expert_ids = he.data();
        hw.num_tokens_post_pad = hn.data();
        const MoeLoraRouting hr = ref::add_lora_w13(hw);
        PUNICA_CUDA_CHECK(cudaDeviceSynchronize());
        const Tensor got = download_y(gy, p.y0, "w13 y");
        EXPECT_EQ(w13_w2_mismatch(got, yref, p, r.naive), "");
        const MoeProblem p2 = w2_problem_after(p);
        DeviceProblem d2(p2);
        GuardedBuf gy2 = guarded(p2.y0);
        FusedMoeLoraArgs a2 = d2.args(p2, gy2.ptr());
        a2.routing = r;
        launch_add_lora_w2(a2, nullptr);
        Tensor yref2 = p2.y0;
        FusedMoeLoraArgs h2 = p2.args(yref2.data());
        h2.routing = hr;
        ref::add_lora_w2(h2);
        PUNICA_CUDA_CHECK(cudaDeviceSynchronize());
        const Tensor got2 = download_y(gy2, p2.y0, "w2 y");
        EXPECT_EQ(w13_w2_mismatch(got2, yref2, p2, r.naive), "");
      }
}

// Timing (prints, asserts nothing; run by hand with --gtest_also_run_disabled_tests): add_lora_w13
// (alignment included) and add_lora_w2 on model shapes, bf16, every token with one of L adapters,
// cold (L2 flushed) and back to back (CUDA graph). bytes = the weights of the (adapter, expert)
// pairs the batch touches at true rank + x rows + y rows read and written.
TEST(FusedMoeLoraPerf, DISABLED_ModelShapes) {
  struct Shape { const char* name; int64_t H, I; int E, k; };
  const Shape shapes[] = {{"qwen3-30b-a3b", 2048, 768, 128, 8}, {"mixtral-8x7b", 4096, 14336, 8, 2}};
  DeviceBuffer flush(std::size_t(120) << 20);
  for (const Shape& sh : shapes)
    for (int T : {1, 16, 64, 512})
      for (int form = 0; form < 2; ++form) {
        MoeCase c;
        c.name = std::string(sh.name) + (form ? "_w2" : "_w13") + "_T" + std::to_string(T);
        c.M = T;
        c.k = sh.k;
        c.E = sh.E;
        c.w2 = form == 1;
        c.S = form ? 1 : 2;
        c.K = form ? sh.I : sh.H;
        c.N = form ? sh.H : sh.I;
        c.ranks = {16, 16, 16, 16};
        c.none_pct = 0;
        c.disabled = {};
        c.bs = 16;
        MoeProblem p = make_problem(c);
        DeviceProblem d(p);
        W13Buffers wb(p);
        const AddLoraW13Args w = wb.args(p, d);
        // w2 reuses the routing of a w13 call on the same topk (its y is scratch here).
        const MoeLoraRouting r = launch_add_lora_w13(w, nullptr);
        PUNICA_CUDA_CHECK(cudaDeviceSynchronize());
        std::vector<uint8_t> touched(std::size_t(p.L) * c.E, 0);
        for (int64_t i = 0; i < p.numel; ++i) touched[std::size_t(p.map[std::size_t(i / c.k)]) * c.E + p.topk[std::size_t(i)]] = 1;
        double bytes = 0;
        for (uint8_t t : touched) bytes += t ? double(c.S) * 16 * double(c.K + c.N) * 2 : 0;
        bytes += double(form ? p.numel : c.M) * c.K * 2 + double(p.numel) * c.S * c.N * 2 * 2;
        auto f = [&](cudaStream_t st) {
          if (form == 0) {
            launch_add_lora_w13(w, st);
          } else {
            FusedMoeLoraArgs a = w.op;
            a.routing = r;
            launch_add_lora_w2(a, st);
          }
        };
        char prefix[160];
        std::snprintf(prefix, sizeof prefix, "%-28s %s %.2f MB", c.name.c_str(), r.naive ? "naive  " : "aligned", bytes / 1e6);
        testutil::perf_line(prefix, "@4TB/s", bytes / 4.0e6, f, flush);
      }
}

// Column tiles (N odd, not a multiple of the tile), shrink row groups, the fused kernel's
// recomputing tiles (small K), at decode and a few tokens: adapters missing, add_inputs off, offset.
std::vector<MoeCase> tile_cases() {
  std::vector<MoeCase> v;
  MoeCase c;
  c.name = "decode_N777_r24"; c.M = 1; c.k = 2; c.E = 4; c.none_pct = 0; c.ranks = {24, 16}; c.K = 40; c.N = 777;
  v.push_back(c);
  c.name = "decode_naive"; c.naive = true; v.push_back(c);
  c.name = "decode_r64_K4096_N14336"; c.naive = false; c.ranks = {64}; c.K = 4096; c.N = 14336; v.push_back(c);
  c.name = "few_noadd_offset"; c.M = 9; c.ranks = {24, 16, 0}; c.K = 40; c.N = 515; c.none_pct = 40; c.add_inputs = false;
  c.offset = 5; v.push_back(c);
  c.name = "few_w2_recompute"; c.add_inputs = true; c.offset = 3; c.w2 = true; c.S = 1; c.K = 8; c.N = 1031;
  c.ranks = {8, 5}; v.push_back(c);
  c.name = "many_N1031"; c.M = 700; c.w2 = false; c.S = 2; c.offset = 0; c.K = 64; c.ranks = {16, 8, 16}; v.push_back(c);
  // The tensor-core kernels (heuristics.h): the mma shrink (>= 4 pairs per alignment block), the mma
  // expand walking several column tiles per block, partial true ranks, NaN padding, scalar y rows.
  c.name = "mma_prefill_w13"; c.M = 2000; c.E = 8; c.K = 136; c.N = 5128; c.ranks = {16, 9, 16, 0}; c.none_pct = 10;
  v.push_back(c);
  c.name = "mma_rank40_w2_nan_bs32"; c.M = 700; c.w2 = true; c.S = 1; c.ranks = {40, 33, 0}; c.N = 136; c.offset = 8;
  c.add_inputs = false; c.nan_pad = true; c.shared_b = true; c.bs = 32; v.push_back(c);
  c.name = "mma_r64_f16_bs64_scalar_y"; c.dtype = c.inter = DType::f16; c.M = 1500; c.k = 4; c.E = 16; c.w2 = false;
  c.S = 2; c.ranks = {64, 48, 64}; c.K = 256; c.N = 1000; c.offset = 0; c.add_inputs = true; c.nan_pad = true;
  c.shared_b = false; c.bs = 64; v.push_back(c);
  // The one call's split-K mma shrink (K >= 1024): Mixtral w2's K at decode, mixed ranks 1 / 17 / 64,
  // K not a multiple of 32 or of the parts, block sizes 32 / 64 with many pairs, an fp32 intermediate.
  c.name = "splitk_w2_K14336_T16"; c.dtype = c.inter = DType::bf16; c.M = 16; c.k = 2; c.E = 8; c.w2 = true; c.S = 1;
  c.K = 14336; c.N = 520; c.ranks = {16, 16, 16, 16}; c.none_pct = 0; c.nan_pad = false; c.bs = 16; v.push_back(c);
  c.name = "splitk_w2_mixed_r64_nan"; c.M = 64; c.K = 4104; c.ranks = {64, 17, 1, 0}; c.nan_pad = true; c.offset = 8;
  c.add_inputs = false; v.push_back(c);
  c.name = "splitk_w13_bs32_f32inter"; c.inter = DType::f32; c.M = 200; c.w2 = false; c.S = 2; c.K = 2056; c.N = 264;
  c.ranks = {16, 9, 16}; c.offset = 0; c.add_inputs = true; c.nan_pad = false; c.bs = 32; v.push_back(c);
  c.name = "splitk_bs64_f16"; c.dtype = c.inter = DType::f16; c.M = 300; c.E = 2; c.K = 1544; c.ranks = {32, 17};
  c.bs = 64; v.push_back(c);
  return v;
}
class FusedMoeLoraTiles : public ::testing::TestWithParam<MoeCase> {};
TEST_P(FusedMoeLoraTiles, MatchesReference) { run_fused_case(GetParam()); }
INSTANTIATE_TEST_SUITE_P(Cases, FusedMoeLoraTiles, ::testing::ValuesIn(tile_cases()),
                         [](const auto& i) { return i.param.name; });

TEST(FusedMoeLoraEdge, ZeroTokensTouchesNothing) {
  MoeCase c;
  c.name = "zero";
  c.M = 0;
  for (bool naive : {false, true}) {
    c.naive = naive;
    run_fused_case(c);
  }
}

}  // namespace
}  // namespace punica::kernels
