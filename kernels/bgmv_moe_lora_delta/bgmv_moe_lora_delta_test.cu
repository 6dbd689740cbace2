// GPU test of bgmv_moe_gemm1_lora_delta (regular and shared-A) and bgmv_moe_gemm2_lora_delta against
// the Eigen reference (DESIGN §6 tolerance), both paths (pairs, grouped: asserted per case): outputs
// poisoned with NaN and guarded, columns past the output width (ld_out > width) bit-equal, rows
// without a delta exactly +0, NaN padding past each slot's true rank, odd shapes (H 1000, I 1408 /
// 700 / 57, ranks 1 / 7 / 24 / 64 / 128 / 256), a stride-0 expert dim, slots >= L and expert ids
// outside [0, E) (no delta), fp16 / bf16 LoRA, bf16 / fp16 / fp32 outputs, and FlashInfer's test
// shapes (SPEC §4.8.6).
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "kernels/bgmv_moe_lora_delta/bgmv_moe_lora_delta.h"
#include "kernels/bgmv_moe_lora_delta/delta_test_util.h"
#include "kernels/common/test_util.h"
#include "reference/bgmv_moe_reference.h"

namespace punica::kernels {
namespace {
using namespace testutil;
using namespace deltatest;

DeviceBuffer upload_ints(const std::vector<int32_t>& v) {
  DeviceBuffer b(std::max<std::size_t>(v.size() * 4, 16));
  if (!v.empty()) b.upload(v.data(), v.size() * 4);
  return b;
}
DeviceBuffer upload_i64(const std::vector<int64_t>& v) {
  DeviceBuffer b(std::max<std::size_t>(v.size() * 8, 16));
  if (!v.empty()) b.upload(v.data(), v.size() * 8);
  return b;
}
HostTensor nan_out(DType t, std::size_t n) {
  HostTensor h(t, n);
  h.fill_nan();
  return h;
}

void expect_output(const HostTensor& got, const HostTensor& want, const HostTensor& init, DType lora, int64_t rows,
                   int64_t ld, int64_t width, const std::vector<char>& zero_rows, bool guards_ok, const std::string& what) {
  EXPECT_TRUE(guards_ok) << what << ": guard region overwritten";
  const OutputCheck o = check_output(got, want, init, lora, rows, ld, width, zero_rows);
  EXPECT_EQ(o.nwrong, 0u) << what << " " << o.first << " (" << o.nuntouched << " past the width changed)";
  EXPECT_EQ(o.nonzero, 0) << what << ": rows without a delta are not exactly +0";
}

// Runs the launcher over a poisoned workspace of `bytes` and returns the output (guards checked).
template <class A, class L>
HostTensor launch_into(A a, std::size_t bytes, L launch, const Guarded& out, bool& guards_ok) {
  DeviceBuffer ws(std::max<std::size_t>(bytes, 16));
  device_fill_pattern(ws.get(), bytes / 4, 4, 0x7fc00001u, nullptr);
  a.workspace = ws.get();
  a.workspace_bytes = bytes;
  launch(a, nullptr);
  PUNICA_CUDA_CHECK(cudaDeviceSynchronize());
  return out.download(guards_ok);
}

void run_gemm1(const DeltaCase& c) {
  SCOPED_TRACE(c.name());
  const Gemm1Host g(c);
  std::vector<DeviceBuffer> dA, dB;
  std::vector<const void*> hA, hB, pA, pB;
  for (int s = 0; s < g.S; ++s) {
    dA.push_back(to_device(g.in.A[std::size_t(s)]));
    dB.push_back(to_device(g.in.B[std::size_t(s)]));
    hA.push_back(g.in.A[std::size_t(s)].data());
    hB.push_back(g.in.B[std::size_t(s)].data());
    pA.push_back(dA.back().get());
    pB.push_back(dB.back().get());
  }
  DeviceBuffer ta = upload_i64(g.in.table(pA, g.in.A, c.E, g.ia)), tb = upload_i64(g.in.table(pB, g.in.B, c.E, g.ib));
  const auto hta = g.in.table(hA, g.in.A, c.E, g.ia), htb = g.in.table(hB, g.in.B, c.E, g.ib);
  DeviceBuffer dx = to_device(g.x), dl = upload_ints(g.in.lora_ids), dt = upload_ints(g.in.topk), dr = upload_ints(g.in.ranks);
  const HostTensor init = nan_out(c.out, std::size_t(std::max<int64_t>(g.P, 1) * g.ld));
  Guarded dout(init);
  BgmvMoeGemm1Args a = g.args(ta.as<int64_t>(), tb.as<int64_t>(), dr.as<int32_t>(), dx.get(), dt.as<int32_t>(),
                              dl.as<int32_t>(), dout.ptr());
  EXPECT_EQ(int(plan_bgmv_moe_gemm1(a).path), int(c.want)) << describe_bgmv_moe_gemm1_plan(a);
  bool guards_ok = false;
  const HostTensor got = launch_into(a, bgmv_moe_gemm1_workspace_bytes(a), launch_bgmv_moe_gemm1_lora_delta, dout, guards_ok);
  HostTensor want = init;
  ref::bgmv_moe_gemm1_lora_delta(
      g.args(hta.data(), htb.data(), g.in.ranks.data(), g.x.data(), g.in.topk.data(), g.in.lora_ids.data(), want.data()));
  expect_output(got, want, init, c.lora, g.P, g.ld, g.W, g.zero_rows(), guards_ok, "gemm1");
}

void run_gemm2(const DeltaCase& c) {
  SCOPED_TRACE(c.name());
  const Gemm2Host g(c);
  DeviceBuffer dA = to_device(g.in.A[0]), dB = to_device(g.in.B[0]);
  DeviceBuffer ta = upload_i64(g.in.table({dA.get()}, g.in.A, c.E, g.ia)),
               tb = upload_i64(g.in.table({dB.get()}, g.in.B, c.E, g.ib));
  const auto hta = g.in.table({g.in.A[0].data()}, g.in.A, c.E, g.ia), htb = g.in.table({g.in.B[0].data()}, g.in.B, c.E, g.ib);
  DeviceBuffer dact = to_device(g.act), dl = upload_ints(g.in.lora_ids), dt = upload_ints(g.in.topk),
               dr = upload_ints(g.in.ranks), dp = upload_ints(g.perm), dw(g.w.size() * 4);
  dw.upload(g.w.data(), g.w.size() * 4);
  const HostTensor init = nan_out(c.out, std::size_t(std::max<int64_t>(c.T, 1) * g.ld));
  Guarded dout(init);
  BgmvMoeGemm2Args a = g.args(ta.as<int64_t>(), tb.as<int64_t>(), dr.as<int32_t>(), dact.get(), dp.as<int32_t>(),
                              dw.as<float>(), dt.as<int32_t>(), dl.as<int32_t>(), dout.ptr());
  EXPECT_EQ(int(plan_bgmv_moe_gemm2(a).path), int(c.want)) << describe_bgmv_moe_gemm2_plan(a);
  bool guards_ok = false;
  const HostTensor got = launch_into(a, bgmv_moe_gemm2_workspace_bytes(a), launch_bgmv_moe_gemm2_lora_delta, dout, guards_ok);
  HostTensor want = init;
  ref::bgmv_moe_gemm2_lora_delta(g.args(hta.data(), htb.data(), g.in.ranks.data(), g.act.data(), g.perm.data(),
                                        g.w.data(), g.in.topk.data(), g.in.lora_ids.data(), want.data()));
  expect_output(got, want, init, c.lora, c.T, g.ld, c.H, g.zero_rows(), guards_ok, "gemm2");
}

// FlashInfer's test_gemm1_lora_delta (SPEC §4.8.6): T {4, 16}, H = I = 768, rank {16, 32}, E 8,
// k 2, L 4, scale 0.5, both modes, bf16 / fp16.
TEST(BgmvMoeGemm1, FlashInferShapes) {
  for (int64_t T : {4, 16})
    for (int r : {16, 32})
      for (bool sa : {false, true})
        for (DType dt : {DType::bf16, DType::f16}) {
          DeltaCase c = mk(T, 2, 768, 768, 8, 4, r, kPairs);
          c.shared_a = sa;
          c.lora = dt;
          run_gemm1(c);
        }
}

TEST(BgmvMoeGemm1, OddShapesBothPaths) {
  struct S { int64_t T, H, I; int rank; std::vector<int> ranks; BgmvMoePath want; };
  const std::vector<S> grid = {
      {5, 1000, 1408, 24, {24, 7, 1}, kPairs},  {512, 1000, 1408, 24, {24, 7, 1}, kGrouped},
      {3, 1000, 700, 7, {7, 1}, kPairs},        {256, 1000, 700, 7, {7, 1}, kGrouped},
      {9, 75, 57, 64, {64, 13}, kPairs},        {384, 75, 57, 64, {64, 13}, kGrouped},
      {512, 1000, 700, 128, {128, 100}, kGrouped}, {64, 2048, 768, 64, {64}, kGrouped},
      {128, 2100, 300, 16, {16, 5}, kGrouped},  // K split over 4 blocks, the last partial, K % 8 != 0
  };
  for (const auto& g : grid)
    for (bool sa : {false, true})
      for (bool nan : {false, true}) {
        DeltaCase c = mk(g.T, 2, g.H, g.I, 8, 4, g.rank, g.want);
        c.ranks = g.ranks; c.shared_a = sa; c.nan_pad = nan; c.odd_ids = true; c.extra_ld = 3;
        run_gemm1(c);
      }
}

// The grouped expand's blocks walking from the gate slice's column tiles into the up slice's (1600
// pairs: 3 of the 2 x 40 tiles per block), regular and shared-A.
TEST(BgmvMoeGemm1, ExpandTilesCrossSlices) {
  for (bool sa : {false, true}) {
    DeltaCase c = mk(400, 4, 40, 2560, 4, 2, 16, kGrouped);
    c.ranks = {16, 5}; c.shared_a = sa; c.nan_pad = true;
    run_gemm1(c);
  }
}

TEST(BgmvMoeGemm1, LargeRankFallsBackToPairs) {
  DeltaCase c = mk(512, 2, 512, 384, 8, 4, 256, kPairs);  // regular r=256: 512 on-chip columns > 256
  c.ranks = {256, 33};
  c.nan_pad = true;
  run_gemm1(c);
  c.shared_a = true;  // shared-A r=256: 256 columns, grouped
  c.want = kGrouped;
  run_gemm1(c);
}

TEST(BgmvMoeGemm1, DtypesStrideZeroExpertsTileHeights) {
  for (DType out : {DType::bf16, DType::f16, DType::f32})
    for (bool se : {false, true})
      for (int64_t T : {4, 64, 128, 1024}) {  // pairs, grouped bm16 / bm32 / bm64 (k 4, E 8, L 2)
        DeltaCase c = mk(T, 4, 512, 320, 8, 2, 16, T == 4 ? kPairs : kGrouped);
        c.out = out; c.shared_experts = se; c.lora = DType::f16; c.ranks = {16, 8};
        run_gemm1(c);
      }
}

TEST(BgmvMoeGemm1, EmptyBatch) {
  DeltaCase c = mk(0, 2, 64, 64, 8, 4, 16, kPairs);
  run_gemm1(c);
}

TEST(BgmvMoeGemm2, ShapesAndPaths) {
  struct S { int64_t T; int k; int64_t H, I; int rank; std::vector<int> ranks; BgmvMoePath want; };
  const std::vector<S> grid = {
      {4, 2, 768, 768, 16, {}, kPairs},           {16, 2, 768, 768, 32, {}, kPairs},
      {7, 2, 1000, 1408, 24, {24, 7, 1}, kPairs}, {512, 2, 1000, 1408, 24, {24, 7, 1}, kGrouped},
      {300, 4, 57, 75, 64, {64, 5}, kGrouped},    {1024, 4, 2048, 768, 128, {128, 64}, kGrouped},
      {64, 2, 1000, 700, 300, {300, 3}, kPairs},  {96, 2, 520, 3000, 24, {24, 9}, kGrouped},  // K split 5
      {512, 2, 1000, 700, 40, {40, 19}, kGrouped},  // 6 B pieces per row: divided out, not shifted
  };
  for (const auto& g : grid)
    for (bool nan : {false, true})
      for (double inactive : {0.0, 0.3}) {
        DeltaCase c = mk(g.T, g.k, g.H, g.I, 8, 4, g.rank, g.want);
        c.ranks = g.ranks; c.nan_pad = nan; c.inactive = inactive; c.odd_ids = true; c.extra_ld = 5;
        run_gemm2(c);
      }
}

TEST(BgmvMoeGemm2, DtypesStrideZeroExperts) {
  for (DType out : {DType::bf16, DType::f16, DType::f32})
    for (bool se : {false, true})
      for (int64_t T : {8, 512}) {
        DeltaCase c = mk(T, 2, 512, 320, 8, 4, 16, T == 8 ? kPairs : kGrouped);
        c.out = out; c.shared_experts = se; c.lora = DType::f16;
        run_gemm2(c);
      }
  run_gemm2(mk(0, 2, 64, 64, 8, 4, 16, kPairs));
}

}  // namespace
}  // namespace punica::kernels
