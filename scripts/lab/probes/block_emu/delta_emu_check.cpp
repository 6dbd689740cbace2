// The FlashInfer MoE LoRA delta kernels run on the CPU through block_emu.h + delta_emu.h
// (delta_emu_check.sh builds this) against the Eigen reference, on small cases of the GPU test's
// grid (kernels/bgmv_moe_lora_delta/delta_test_util.h): both paths (asserted), both gemm1 modes,
// gemm2, odd shapes, NaN padding, stride-0 experts, slots >= L and expert ids >= E. Exit 1 on a failure.
#include <cstdio>
#include <string>
#include "kernels/bgmv_moe_lora_delta/delta_test_util.h"
#include "reference/bgmv_moe_reference.h"
using namespace punica::kernels;
using namespace punica::kernels::deltatest;
static int fails = 0, total = 0;

static HostTensor nan_tensor(DType t, std::size_t n) {
  HostTensor h(t, n);
  h.fill_nan();
  return h;
}
static void check(const std::string& what, const HostTensor& got, const HostTensor& want, const HostTensor& init,
                  DType lora, int64_t rows, int64_t ld, int64_t width, const std::vector<char>& zero_rows, bool path_ok) {
  ++total;
  const OutputCheck o = check_output(got, want, init, lora, rows, ld, width, zero_rows);
  if (!o.ok() || !path_ok) {
    ++fails;
    std::printf("FAIL %s: nwrong=%zu nonzero_zero_rows=%lld path_ok=%d %s\n", what.c_str(), o.nwrong,
                (long long)o.nonzero, int(path_ok), o.first.c_str());
  } else {
    std::printf("ok   %s\n", what.c_str());
  }
}

static void gemm1(const DeltaCase& c) {
  const Gemm1Host g(c);
  std::vector<const void*> hA, hB;
  for (int s = 0; s < g.S; ++s) { hA.push_back(g.in.A[std::size_t(s)].data()); hB.push_back(g.in.B[std::size_t(s)].data()); }
  const auto ta = g.in.table(hA, g.in.A, c.E, g.ia), tb = g.in.table(hB, g.in.B, c.E, g.ib);
  const HostTensor init = nan_tensor(c.out, std::size_t(std::max<int64_t>(g.P, 1) * g.ld));
  HostTensor got = init, want = init;
  BgmvMoeGemm1Args a = g.args(ta.data(), tb.data(), g.in.ranks.data(), g.x.data(), g.in.topk.data(), g.in.lora_ids.data(), got.data());
  const bool path_ok = plan_bgmv_moe_gemm1(a).path == c.want;
  a.workspace_bytes = bgmv_moe_gemm1_workspace_bytes(a);
  std::vector<uint32_t> ws((a.workspace_bytes + 3) / 4 + 4, 0x7fc00001u);
  a.workspace = ws.data();
  launch_bgmv_moe_gemm1_lora_delta(a, nullptr);
  punica::ref::bgmv_moe_gemm1_lora_delta(
      g.args(ta.data(), tb.data(), g.in.ranks.data(), g.x.data(), g.in.topk.data(), g.in.lora_ids.data(), want.data()));
  check("gemm1 " + c.name() + " " + describe_bgmv_moe_gemm1_plan(a), got, want, init, c.lora, g.P, g.ld, g.W, g.zero_rows(), path_ok);
}

static void gemm2(const DeltaCase& c) {
  const Gemm2Host g(c);
  const auto ta = g.in.table({g.in.A[0].data()}, g.in.A, c.E, g.ia), tb = g.in.table({g.in.B[0].data()}, g.in.B, c.E, g.ib);
  const HostTensor init = nan_tensor(c.out, std::size_t(std::max<int64_t>(c.T, 1) * g.ld));
  HostTensor got = init, want = init;
  BgmvMoeGemm2Args a = g.args(ta.data(), tb.data(), g.in.ranks.data(), g.act.data(), g.perm.data(), g.w.data(),
                              g.in.topk.data(), g.in.lora_ids.data(), got.data());
  const bool path_ok = plan_bgmv_moe_gemm2(a).path == c.want;
  a.workspace_bytes = bgmv_moe_gemm2_workspace_bytes(a);
  std::vector<uint32_t> ws((a.workspace_bytes + 3) / 4 + 4, 0x7fc00001u);
  a.workspace = ws.data();
  launch_bgmv_moe_gemm2_lora_delta(a, nullptr);
  punica::ref::bgmv_moe_gemm2_lora_delta(g.args(ta.data(), tb.data(), g.in.ranks.data(), g.act.data(), g.perm.data(),
                                                g.w.data(), g.in.topk.data(), g.in.lora_ids.data(), want.data()));
  check("gemm2 " + c.name() + " " + describe_bgmv_moe_gemm2_plan(a), got, want, init, c.lora, c.T, g.ld, c.H, g.zero_rows(), path_ok);
}

int main() {
  for (bool sa : {false, true})
    for (bool nan : {false, true}) {
      DeltaCase c = mk(5, 2, 100, 57, 8, 4, 24, kPairs);
      c.ranks = {24, 7, 1}; c.shared_a = sa; c.nan_pad = nan; c.odd_ids = true; c.extra_ld = 3;
      gemm1(c);
      DeltaCase g = mk(48, 2, 96, 40, 4, 2, 24, kGrouped);  // 96 pairs over 8 groups: grouped bm16
      g.ranks = {24, 7}; g.shared_a = sa; g.nan_pad = nan; g.odd_ids = true; g.extra_ld = 3;
      gemm1(g);
      DeltaCase g64 = mk(100, 4, 64, 64, 4, 2, 16, kGrouped);  // 400 pairs over 8 groups: bm64
      g64.shared_a = sa; g64.nan_pad = nan; g64.out = DType::f32; g64.lora = DType::f16; g64.shared_experts = nan;
      gemm1(g64);
      DeltaCase r2 = mk(4, 2, 72, 24, 8, 4, 16, kPairs);
      r2.out = DType::f16; r2.shared_experts = true; r2.nan_pad = nan;
      gemm2(r2);
      DeltaCase r3 = mk(48, 2, 75, 40, 4, 2, 24, kGrouped);
      r3.ranks = {24, 5}; r3.nan_pad = nan; r3.inactive = 0.3; r3.odd_ids = true; r3.extra_ld = 5;
      r3.out = sa ? DType::f32 : DType::bf16;
      gemm2(r3);
    }
  {  // the grouped tile at its limits: 64 pairs x 256 on-chip columns (16 mma tiles per warp), bm32
    DeltaCase big = mk(100, 4, 40, 24, 4, 2, 128, kGrouped);
    big.ranks = {128, 97}; big.nan_pad = true;
    gemm1(big);
    big.shared_a = true; big.rank = 256; big.ranks = {256, 33};
    gemm1(big);
    DeltaCase b32 = mk(64, 4, 48, 40, 4, 2, 32, kGrouped);  // 256 pairs over 8 groups: bm32
    b32.ranks = {32, 9};
    gemm1(b32);
    gemm2(b32);
    DeltaCase kst = mk(48, 2, 300, 40, 4, 2, 16, kGrouped);  // K stages of 256 (r 16) and 128 (r 64), partial last
    kst.ranks = {16, 3}; kst.nan_pad = true; kst.odd_ids = true;
    gemm1(kst);
    kst.rank = 64; kst.ranks = {64, 50};
    gemm1(kst);
    DeltaCase kst2 = mk(48, 2, 40, 300, 4, 2, 64, kGrouped);
    kst2.inactive = 0.2;
    gemm2(kst2);
    DeltaCase ks1 = mk(48, 2, 1100, 40, 4, 2, 16, kGrouped);  // K split in 2 (odd K: scalar loads)
    ks1.ranks = {16, 3}; ks1.nan_pad = true; ks1.odd_ids = true;
    gemm1(ks1);
    ks1.shared_a = true;
    gemm1(ks1);
    DeltaCase ks2 = mk(48, 2, 40, 2104, 4, 2, 24, kGrouped);  // K split in 4, the last one partial
    ks2.ranks = {24, 5}; ks2.inactive = 0.3; ks2.nan_pad = true;
    gemm2(ks2);
    // padded ranks whose 16-byte pieces per B row (6, 3) do not divide the expand's 256 threads
    // (the pieces divided out per piece), and a rank-0 adapter, both halves
    DeltaCase odd = mk(48, 2, 75, 40, 4, 2, 40, kGrouped);
    odd.ranks = {40, 0}; odd.nan_pad = true; odd.odd_ids = true;
    gemm1(odd);
    odd.ranks = {40, 19}; odd.inactive = 0.2;
    gemm2(odd);
    // 1600 pairs: the column split leaves 3 of the 2 x 40 column tiles per expand block, so blocks
    // run from the gate slice into the up slice (the tile walk's slice counter)
    DeltaCase cross = mk(400, 4, 40, 2560, 4, 2, 16, kGrouped);
    cross.ranks = {16, 5};
    gemm1(cross);
    // the register epilogue's stores (mma_epilogue.cuh) at odd widths: whole and partial chunks of
    // 8 (bm64) / 4 (bm32) columns, rows whose starts are not aligned to the chunk, fp32 and bf16
    DeltaCase o64 = mk(100, 4, 37, 37, 4, 2, 16, kGrouped);
    o64.ranks = {16, 9}; o64.extra_ld = 1; o64.nan_pad = true;
    gemm1(o64);
    gemm2(o64);
    o64.out = DType::f32;
    gemm1(o64);
    gemm2(o64);
    DeltaCase o32 = mk(64, 4, 45, 37, 4, 2, 32, kGrouped);
    o32.ranks = {32, 17}; o32.inactive = 0.2;
    gemm1(o32);
    gemm2(o32);
    DeltaCase many = mk(3, 10, 40, 24, 12, 2, 16, kPairs);  // 10 slots over the expand's 8 warps
    many.nan_pad = true; many.odd_ids = true;
    gemm2(many);
    DeltaCase wide = mk(16, 2, 40, 24, 4, 2, 300, kPairs);  // S x 304 > 256: pairs; 8 rank rows per block
    wide.ranks = {300, 17}; wide.nan_pad = true;
    gemm1(wide);
    gemm2(wide);
  }
  std::printf("%d of %d checks failed\n", fails, total);
  return fails ? 1 : 0;
}
