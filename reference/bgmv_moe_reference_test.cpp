// The Eigen reference of FlashInfer's MoE LoRA deltas against the independent fp64 loops (CPU, in
// CI): both gemm1 modes and gemm2 over the GPU test's case builder (kernels/bgmv_moe_lora_delta/
// delta_test_util.h) with host pointer tables: odd shapes, mixed true ranks with NaN padding past
// them (never read), stride-0 experts, slots >= L and expert ids >= E (exact-zero rows), inactive
// gemm2 slots, every output dtype; and the argument checks.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "kernels/bgmv_moe_lora_delta/delta_test_util.h"
#include "kernels/common/error.h"
#include "reference/bgmv_moe_reference.h"

namespace punica::ref {
namespace {
using namespace kernels;
using namespace kernels::deltatest;

HostTensor poisoned(DType t, std::size_t n) {
  HostTensor h(t, n);
  h.fill_nan();
  return h;
}

void gemm1(const DeltaCase& c) {
  SCOPED_TRACE(c.name());
  const Gemm1Host g(c);
  std::vector<const void*> hA, hB;
  for (int s = 0; s < g.S; ++s) { hA.push_back(g.in.A[std::size_t(s)].data()); hB.push_back(g.in.B[std::size_t(s)].data()); }
  const auto ta = g.in.table(hA, g.in.A, c.E, g.ia), tb = g.in.table(hB, g.in.B, c.E, g.ib);
  const HostTensor init = poisoned(c.out, std::size_t(std::max<int64_t>(g.P, 1) * g.ld));
  HostTensor eig = init, nai = init;
  bgmv_moe_gemm1_lora_delta(g.args(ta.data(), tb.data(), g.in.ranks.data(), g.x.data(), g.in.topk.data(), g.in.lora_ids.data(), eig.data()));
  naive::bgmv_moe_gemm1_lora_delta(g.args(ta.data(), tb.data(), g.in.ranks.data(), g.x.data(), g.in.topk.data(), g.in.lora_ids.data(), nai.data()));
  const OutputCheck o = check_output(eig, nai, init, c.lora, g.P, g.ld, g.W, g.zero_rows());
  EXPECT_EQ(o.nwrong, 0u) << o.first;
  EXPECT_EQ(o.nonzero, 0);
}

void gemm2(const DeltaCase& c) {
  SCOPED_TRACE(c.name());
  const Gemm2Host g(c);
  const auto ta = g.in.table({g.in.A[0].data()}, g.in.A, c.E, g.ia), tb = g.in.table({g.in.B[0].data()}, g.in.B, c.E, g.ib);
  const HostTensor init = poisoned(c.out, std::size_t(std::max<int64_t>(c.T, 1) * g.ld));
  HostTensor eig = init, nai = init;
  auto args = [&](void* out) {
    return g.args(ta.data(), tb.data(), g.in.ranks.data(), g.act.data(), g.perm.data(), g.w.data(), g.in.topk.data(),
                  g.in.lora_ids.data(), out);
  };
  bgmv_moe_gemm2_lora_delta(args(eig.data()));
  naive::bgmv_moe_gemm2_lora_delta(args(nai.data()));
  const OutputCheck o = check_output(eig, nai, init, c.lora, c.T, g.ld, c.H, g.zero_rows());
  EXPECT_EQ(o.nwrong, 0u) << o.first;
  EXPECT_EQ(o.nonzero, 0);
}

TEST(BgmvMoeReference, Gemm1MatchesFp64Loops) {
  for (bool sa : {false, true})
    for (bool se : {false, true})
      for (DType out : {DType::bf16, DType::f16, DType::f32}) {
        DeltaCase c = mk(9, 2, 75, 57, 8, 4, 24, kPairs);
        c.ranks = {24, 7, 1, 0};
        c.shared_a = sa; c.shared_experts = se; c.out = out; c.nan_pad = true; c.odd_ids = true; c.extra_ld = 3;
        c.lora = se ? DType::f16 : DType::bf16;
        gemm1(c);
      }
}

TEST(BgmvMoeReference, Gemm2MatchesFp64Loops) {
  for (bool se : {false, true})
    for (DType out : {DType::bf16, DType::f16, DType::f32})
      for (double inactive : {0.0, 0.4}) {
        DeltaCase c = mk(11, 3, 57, 75, 8, 4, 24, kPairs);
        c.ranks = {24, 7, 1, 0};
        c.shared_experts = se; c.out = out; c.nan_pad = true; c.odd_ids = true; c.extra_ld = 5; c.inactive = inactive;
        gemm2(c);
      }
}

TEST(BgmvMoeReference, ArgumentErrorsNameTheField) {
  const Gemm1Host g(mk(2, 2, 16, 16, 4, 2, 8, kPairs));
  std::vector<int64_t> t(8, 0);
  HostTensor out(DType::bf16, 4 * 32);
  BgmvMoeGemm1Args a = g.args(t.data(), t.data(), nullptr, g.x.data(), g.in.topk.data(), g.in.lora_ids.data(), out.data());
  a.lora_dtype = DType::f32;
  try {
    bgmv_moe_gemm1_lora_delta(a);
    FAIL() << "fp32 LoRA accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("lora_dtype"), std::string::npos) << e.what();
  }
  a.lora_dtype = DType::bf16;
  a.rank = 0;
  EXPECT_THROW(bgmv_moe_gemm1_lora_delta(a), Error);
  a.rank = 8;
  a.ld_out = 5;
  EXPECT_THROW(naive::bgmv_moe_gemm1_lora_delta(a), Error);
}

}  // namespace
}  // namespace punica::ref
