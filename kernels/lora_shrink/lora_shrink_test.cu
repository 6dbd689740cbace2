// GPU test of lora_shrink (vLLM add_shrink) against the Eigen reference: mixed true ranks, -1
// tokens, empty slots, K = 2049 (misaligned rows) and 4096, 1 and 3 slices, every dtype, NaN in
// A's padding rows, NaN-poisoned output with guards (shrink must overwrite all of y).
#include <gtest/gtest.h>
#include <cmath>
#include "kernels/lora_shrink/lora_shrink.h"
#include "kernels/lora_shrink/heuristics.h"
#include "kernels/lora_shrink/lora_shrink_internal.h"
#include <cstdio>
#include <numeric>
#include "kernels/lora_shrink/lora_device.cuh"
#include "kernels/common/test_util.h"
#include "kernels/lora_shrink/wgmma.cuh"
#include "reference/lora_reference.h"

namespace punica::kernels {
namespace {
using namespace testutil;

struct ShrinkCase {
  DType dtype = DType::bf16;
  DType out = DType::f32;
  int T = 7;
  int64_t K = 4096;
  int S = 1;
  std::vector<int> ranks = {16, 8, 0, 16};  // per slot; max -> R unless R given
  int R = 0;
  bool nan_pad = false;
  bool all_none = false;
  float scale = 0.5f;
  uint64_t seed = 1;
  ShrinkKernel kernel = ShrinkKernel::automatic;
  bool late = false;  // x written by the kernel directly before the op (testutil::late_copy)
  int hint = 0;       // num_active_loras (0 = not given)
};

void run_case(const ShrinkCase& c) {
  SCOPED_TRACE(std::string(dtype_name(c.dtype)) + " kernel=" + std::to_string(int(c.kernel)) + " T=" + std::to_string(c.T) + " K=" + std::to_string(c.K) +
               " S=" + std::to_string(c.S) + " R=" + std::to_string(c.R));
  const int L = int(c.ranks.size());
  const int R = c.R ? c.R : *std::max_element(c.ranks.begin(), c.ranks.end());
  const uint64_t key = hash_key(c.seed, hash_string("shrink"), 0);
  HostTensor x = random_tensor(c.dtype, std::size_t(c.T) * c.K, key + 1);
  std::vector<HostTensor> A;
  for (int s = 0; s < c.S; ++s) {
    A.push_back(random_tensor(c.dtype, std::size_t(L) * R * c.K, key + 10 + s, 0.25f));
    if (c.nan_pad)
      for (int l = 0; l < L; ++l)
        for (int j = c.ranks[l]; j < R; ++j)
          for (int64_t k = 0; k < c.K; ++k) A[s].set((std::size_t(l) * R + j) * c.K + k, NAN);
  }
  std::vector<int32_t> map = c.all_none ? std::vector<int32_t>(std::size_t(c.T), -1) : make_mapping(c.T, c.ranks, key + 2);
  const HostMeta hm = build_meta(map, L);
  DeviceMeta dm;
  upload_meta(dm, hm);
  std::vector<int32_t> ranks32(c.ranks.begin(), c.ranks.end());
  DeviceBuffer dranks(ranks32.size() * 4);
  dranks.upload(ranks32.data(), ranks32.size() * 4);
  // late: x holds other random values until the kernel before the op copies the real ones in.
  HostTensor x_other;
  DeviceBuffer dx = to_device(before_late(x, c.late, key + 101, x_other));
  DeviceBuffer dx_real = c.late ? to_device(x) : DeviceBuffer();
  std::vector<DeviceBuffer> dA;
  for (auto& a : A) dA.push_back(to_device(a));
  HostTensor y0(c.out, std::size_t(c.S) * c.T * R);
  for (std::size_t i = 0; i < y0.n; ++i) y0.set(i, NAN);
  Guarded gy(y0);

  LoraShrinkArgs a;
  a.dtype = c.dtype;
  a.out_dtype = c.out;
  a.num_tokens = c.T;
  a.hidden = c.K;
  a.x = dx.get();
  a.x_row_stride = c.K;
  a.num_slices = c.S;
  for (int s = 0; s < c.S; ++s) a.lora_a[s] = dA[s].get();
  a.max_loras = L;
  a.num_active_loras = c.hint;
  a.max_rank = R;
  a.lora_ranks = dranks.as<int32_t>();
  a.meta = dm.view();
  a.scale = c.scale;
  a.y = gy.ptr();
  TestStream ts;
  const cudaStream_t st = c.late ? ts.s : nullptr;
  if (c.late) late_copy({dx_real.get(), dx.get(), x.bytes.size()}, {nullptr, nullptr, 0}, st);
  launch_lora_shrink_with(a, c.kernel, st);
  PUNICA_CUDA_CHECK(cudaDeviceSynchronize());
  bool guards = false;
  HostTensor got = gy.download(guards);
  EXPECT_TRUE(guards) << "guard region overwritten";

  HostTensor ref(c.out, y0.n);
  for (std::size_t i = 0; i < ref.n; ++i) ref.set(i, NAN);
  LoraShrinkArgs h = a;
  h.x = x.data();
  for (int s = 0; s < c.S; ++s) h.lora_a[s] = A[s].data();
  h.lora_ranks = ranks32.data();
  h.meta = LoraMetaView{hm.mapping.data(), hm.sorted.data(), hm.active.data(), hm.counts.data(),
                        hm.start.data(), &hm.no_lora, &hm.num_active};
  h.y = ref.data();
  ref::lora_shrink(h);

  // Rows of -1 tokens and columns beyond the true rank: exactly zero.
  std::size_t zeros_wrong = 0;
  for (int s = 0; s < c.S; ++s)
    for (int t = 0; t < c.T; ++t)
      for (int j = 0; j < R; ++j) {
        const int l = map[t];
        if (l < 0 || j >= c.ranks[l]) {
          const std::size_t i = (std::size_t(s) * c.T + t) * R + j;
          if (got.get(i) != 0.f) ++zeros_wrong;
        }
      }
  EXPECT_EQ(zeros_wrong, 0u) << "padding / -1 rows not zero";
  const float rtol = rtol_for(c.out == DType::f32 ? c.dtype : (c.dtype == DType::bf16 || c.out == DType::bf16 ? DType::bf16 : DType::f16));
  std::string rep;
  const std::size_t wrong = compare(got, ref, rtol, {}, rep);
  EXPECT_EQ(wrong, 0u) << rep;
}

TEST(LoraShrink, Bf16Decode) {
  for (int T : {0, 1, 7}) run_case({DType::bf16, DType::f32, T, 4096, 1, {16, 8, 0, 16}});
}
TEST(LoraShrink, Bf16Prefill) { run_case({DType::bf16, DType::f32, 300, 4096, 1, {16, 8, 0, 16}}); }
TEST(LoraShrink, Bf16ThreeSlicesMixed) {
  for (int T : {7, 300}) run_case({DType::bf16, DType::f32, T, 4096, 3, {64, 33, 0, 1, 64}});
}
TEST(LoraShrink, Fp16Hidden2049) {
  for (int T : {1, 7, 300}) run_case({DType::f16, DType::f32, T, 2049, 3, {64, 40, 0, 17}});
}
TEST(LoraShrink, Fp32) {
  for (int T : {1, 7, 300}) run_case({DType::f32, DType::f32, T, 2049, 1, {16, 3, 0, 16}});
  run_case({DType::f32, DType::f32, 40, 4096, 2, {32, 9}});
}
TEST(LoraShrink, Rank1) {
  for (int T : {1, 300}) run_case({DType::bf16, DType::f32, T, 4096, 1, {1, 1, 0}});
}
TEST(LoraShrink, Rank128And512) {
  run_case({DType::bf16, DType::f32, 300, 1024, 1, {128, 100, 0, 128}});
  run_case({DType::bf16, DType::f32, 7, 2049, 1, {512, 77, 512}});
  run_case({DType::f16, DType::f32, 200, 1024, 2, {512, 300, 0}});
}
TEST(LoraShrink, NanPadding) {
  for (int T : {7, 300}) {
    ShrinkCase c{DType::bf16, DType::f32, T, 4096, 3, {64, 5, 0, 40}};
    c.nan_pad = true;
    run_case(c);
  }
  ShrinkCase c{DType::f16, DType::f32, 300, 2049, 1, {32, 7, 0, 19}};
  c.nan_pad = true;
  run_case(c);
}
// Decode kernel, both modes (one token per block with many adapters; token tiles with few), NaN
// padding, misaligned K.
TEST(LoraShrink, DecodeManyAdapters) {
  for (int T : {16, 64, 128}) {
    ShrinkCase c{DType::bf16, DType::f32, T, 4096, 3, testutil::many_ranks()};
    c.nan_pad = true;
    run_case(c);
    ShrinkCase d{DType::bf16, DType::f32, T, 2049, 1, {64, 16}};
    d.nan_pad = true;
    run_case(d);
  }
  run_case({DType::f16, DType::bf16, 64, 1024, 2, {16, 64, 0}});
}
// num_active_loras: one or two adapters in 32 slots, the hint exact, so the choices and grids plan
// for them (the automatic kernels of each batch size), NaN padding, 1 and 3 slices, K = 2049.
TEST(LoraShrink, ActiveLorasHint) {
  testutil::for_each_sparse_hint_case([](int T, const std::vector<int64_t>& widths, const std::vector<int>& ranks, int hint) {
    ShrinkCase c{DType::bf16, DType::f32, T, 4096, int(widths.size()), ranks};
    c.nan_pad = true;
    c.hint = hint;
    run_case(c);
  });
  ShrinkCase d{DType::f16, DType::f32, 300, 2049, 1, testutil::sparse_ranks()};
  d.hint = 2;
  run_case(d);
}
TEST(LoraShrink, SixteenBitOutput) {
  run_case({DType::bf16, DType::bf16, 7, 4096, 2, {16, 8}});
  run_case({DType::f16, DType::f16, 300, 2049, 1, {16, 8, 0}});
}
TEST(LoraShrink, AllTokensNone) {
  ShrinkCase c{DType::bf16, DType::f32, 7, 4096, 1, {16, 8}};
  c.all_none = true;
  run_case(c);
}

// Every kernel choice on the prefill / decode shapes (fused with and without split-K, legacy).
TEST(LoraShrink, KernelVariants) {
  using K = ShrinkKernel;
  for (K k : kShrinkKernels) {
    if (k == K::automatic) continue;
    for (int T : {1, 7, 64, 300}) {  // 64: 12 tokens per adapter, 24 blocks (the small cluster rule)
      ShrinkCase c{DType::bf16, DType::f32, T, 4096, 3, {64, 33, 0, 1, 64}};
      c.kernel = k;
      c.nan_pad = true;
      run_case(c);
    }
    ShrinkCase c2{DType::f16, DType::f32, 300, 1024, 2, {512, 300, 0}};
    c2.kernel = k;
    run_case(c2);
    ShrinkCase c3{DType::bf16, DType::f32, 300, 4096, 1, {16, 8, 0, 16}};
    c3.kernel = k;
    run_case(c3);
    ShrinkCase c4{DType::bf16, DType::f32, 300, 2048, 8, {16, 8, 0, 16}};  // 8 slices: 2 passes
    c4.kernel = k;
    run_case(c4);
    ShrinkCase c5{DType::bf16, DType::f32, 200, 4096, 1, {16, 8}};
    c5.kernel = k;
    c5.all_none = true;
    run_case(c5);
  }
}

// The fused tile's wide split-K (up to 32 splits of 2 k-tiles, one group of 16 columns per warp,
// T <= 256; shrink_heur::fused_config, pinned in heuristics_test) with its float4 atomics, forced
// and through the automatic path (which takes the fused tile for the two one-slice cases; the
// others may go to the cluster tile): ranks 64 / 33 / 1 (pieces past the true rank), an empty slot, NaN
// padding, qkv r=16, K = 8192, and R = 6 (scalar atomics: R % 4 != 0).
TEST(LoraShrink, FusedWideSplit) {
  using K = ShrinkKernel;
  for (K k : {K::automatic, K::fused}) {
    for (auto c : {ShrinkCase{DType::bf16, DType::f32, 256, 4096, 1, {64, 33, 0, 1}},
                   ShrinkCase{DType::f16, DType::f32, 200, 8192, 1, {64}},
                   ShrinkCase{DType::bf16, DType::f32, 256, 4096, 3, {16, 5, 0, 16}},
                   ShrinkCase{DType::bf16, DType::f32, 150, 4096, 2, {6, 3, 6}}}) {
      c.kernel = k;
      c.nan_pad = true;
      run_case(c);
    }
  }
}

// The automatic path's 128-token stream-K tile for one slice at rank <= 32 from 2048 tokens
// (shrink_heur::auto_few_groups_sk): odd token counts, ranks 32 / 16 / 1 / none (NaN padding past
// each), an adapter slot of rank 0, bf16 and fp16, K = 4096 and an odd 2056.
TEST(LoraShrink, FewGroupsStreamK) {
  for (int T : {2048, 2049, 8191})
    for (DType dt : {DType::bf16, DType::f16}) {
      ShrinkCase c{dt, DType::f32, T, T == 2049 ? 2056 : 4096, 1, {32, 16, 0, 1, 32, 7}};
      c.nan_pad = true;
      run_case(c);
    }
  ShrinkCase r16{DType::bf16, DType::f32, 8192, 8192, 1, std::vector<int>(32, 16)};
  r16.nan_pad = true;
  run_case(r16);
}

// Inside the decode band, 32 adapters of 3-4 column groups with 3-4 tokens each: the automatic
// path's warp-k tile ahead of the decode kernel (shrink_heur::auto_wk_decode_band). One slice of
// mixed ranks up to 64 (one of rank 0, NaN padding past each) at T = 96 / 127 / 128, K = 8192, 4096
// and an odd 2056, bf16 and fp16; qkv rank <= 16 at T = 128; and 32 of 40 slots active with the
// caller's count (num_active_loras = 32).
TEST(LoraShrink, WarpKDecodeBand) {
  std::vector<int> r64;
  for (int l = 0; l < 32; ++l) r64.push_back(l == 9 ? 0 : 8 * (1 + (l * 5) % 8));
  r64[0] = 64;
  ASSERT_TRUE(shrink_heur::auto_wk_decode_band(128, 3, 16, 32));
  struct P { int T; int64_t K; DType dt; };
  for (const P& q : {P{96, 8192, DType::bf16}, P{127, 2056, DType::f16}, P{128, 4096, DType::bf16}}) {
    ASSERT_TRUE(shrink_heur::auto_wk_decode_band(q.T, 1, 64, 32)) << "T=" << q.T << " does not reach the rule";
    ShrinkCase c{q.dt, DType::f32, q.T, q.K, 1, r64};
    c.nan_pad = true;
    run_case(c);
  }
  std::vector<int> r16(32, 16);
  r16[3] = 0;
  r16[4] = 5;
  ShrinkCase qkv{DType::bf16, DType::f32, 128, 4096, 3, r16};
  qkv.nan_pad = true;
  run_case(qkv);
  std::vector<int> r40 = r64;
  r40[9] = 24;
  for (int l = 0; l < 8; ++l) r40.push_back(0);  // 8 slots never loaded
  ASSERT_TRUE(shrink_heur::auto_wk_decode_band(100, 1, 64, 32));
  ShrinkCase h{DType::bf16, DType::f32, 100, 4096, 1, r40};
  h.nan_pad = true;
  h.hint = 32;  // the slots with rank > 0
  run_case(h);
}

// Between auto_wg's ranges a standalone shrink takes the wgmma tile for N = 64 and N = 48
// (shrink_heur::auto_wg_band): one slice of mixed ranks up to 64 (a rank-0 slot, NaN padding past
// each rank) at T = 1025 / 2048 / 3072 with K = 4104 (a k tail), 8192 and 4096, and at T = 3329 / 4096
// with K = 4096 / 2056 (the band's K <= 4096 end; T=3329 a split rounded down to one wave); qkv ranks
// <= 16 at T = 1536 / 2049 / 4095 with K = 2056 (odd multiple of 8), 4096, 4104; bf16 and fp16; and one
// rank-64 adapter in 32 slots with the caller's count (num_active_loras = 1) at T = 3071.
TEST(LoraShrink, WgmmaBand) {
  struct P { int T; int64_t K; DType dt; };
  for (const P& q : {P{1025, 4104, DType::bf16}, P{2048, 8192, DType::f16}, P{3072, 4096, DType::bf16},
                     P{3329, 4096, DType::f16}, P{4096, 2056, DType::bf16}}) {
    ASSERT_TRUE(shrink_heur::auto_wg_band(q.T, 1, 64, 4, q.K)) << "T=" << q.T << " does not reach the rule";
    ShrinkCase c{q.dt, DType::f32, q.T, q.K, 1, {64, 33, 0, 7}};
    c.nan_pad = true;
    run_case(c);
  }
  for (const P& q : {P{1536, 2056, DType::bf16}, P{2049, 4096, DType::f16}, P{4095, 4104, DType::bf16}}) {
    ASSERT_TRUE(shrink_heur::auto_wg_band(q.T, 3, 16, 4, q.K)) << "T=" << q.T << " does not reach the rule";
    ShrinkCase c{q.dt, DType::f32, q.T, q.K, 3, {16, 5, 0, 13}};
    c.nan_pad = true;
    run_case(c);
  }
  ASSERT_TRUE(shrink_heur::auto_wg_band(3071, 1, 64, 1, 4096) && !shrink_heur::auto_wg_band(3071, 1, 64, 32, 4096));
  ShrinkCase h{DType::bf16, DType::f32, 3071, 4096, 1, sparse_ranks(true)};
  h.nan_pad = true;
  h.hint = 1;
  run_case(h);
}

// Large prefill: T ~ 8000, 3 slices, 32 adapters of mixed ranks (NaN padding), fused without split.
TEST(LoraShrink, LargePrefillMixed) {
  std::vector<int> ranks;
  for (int l = 0; l < 32; ++l) ranks.push_back(l == 5 ? 0 : 1 + (l * 37) % 64);
  ranks[0] = 64;
  ShrinkCase c{DType::bf16, DType::f32, 8000, 4096, 3, ranks};
  c.nan_pad = true;
  run_case(c);
  c.kernel = ShrinkKernel::fused;  // same, forced
  c.T = 7999;
  c.dtype = DType::f16;
  run_case(c);
  // 128-token tiles (stream-K, the automatic choice's only use of them): ranks up to 32 over 3
  // slices (6 groups).
  std::vector<int> r32;
  for (int l = 0; l < 16; ++l) r32.push_back(l == 3 ? 0 : 1 + (l * 11) % 32);
  ShrinkCase c128{DType::bf16, DType::f32, 8000, 4096, 3, r32};
  c128.nan_pad = true;
  c128.kernel = ShrinkKernel::fused128_sk;
  run_case(c128);
  c128.T = 300;
  c128.dtype = DType::f16;
  run_case(c128);
  c128.kernel = ShrinkKernel::fused_sk;
  run_case(c128);
  ShrinkCase q16{DType::bf16, DType::f32, 1000, 4096, 3, {16, 8, 0, 16}};  // 3 groups: 2 per warp
  q16.nan_pad = true;
  q16.kernel = ShrinkKernel::fused128_sk;
  run_case(q16);
}

// A case through one explicit kernel kind, with NaN in the padding past the true ranks (unless no
// token has an adapter).
void run_forced(ShrinkKernel k, ShrinkCase c) {
  c.kernel = k;
  c.nan_pad = !c.all_none;
  run_case(c);
}

// Two cases every forced tile test runs: stream-K at T=8000 over 32 adapters of ranks up to 16 (one
// without rank), and every token without an adapter.
void run_forced_streamk_and_none(ShrinkKernel k) {
  std::vector<int> r16;
  for (int l = 0; l < 32; ++l) r16.push_back(l == 9 ? 0 : 1 + (l * 7) % 16);
  run_forced(k, {DType::bf16, DType::f32, 8000, 4096, 3, r16});
  ShrinkCase none{DType::bf16, DType::f32, 200, 4096, 2, {16, 8}};
  none.all_none = true;
  run_forced(k, none);
}

// The warp-k tile (adapters of <= 4 groups of 16 columns over all slices): split-K (T=300),
// stream-K (T=8000), no split (K=192: 3 k-tiles), a K % 64 tail (K=4104), R % 4 != 0 (scalar
// stores and atomics), mixed true ranks with NaN padding, every token without an adapter.
// The cluster split-K tile (sm_90): 16- and 32-token tiles, clusters of 1 to 8 CTAs along K, a K
// tail that is not a whole 32-element chunk (K = 2056, 72), column groups of 2 / 4 / 6 / 8 blocks
// and several groups (8 slices, R = 100), mixed true ranks (0, 1, 13, 33) with NaN padding, tokens
// without an adapter, every token without one, both 16-bit dtypes.
TEST(LoraShrink, ClusterTile) {
  if (!detail::cluster_available()) GTEST_SKIP() << "needs a device with thread-block clusters (sm_90)";
  using K = ShrinkKernel;
  auto cl = [](ShrinkCase c) { run_forced(K::cluster, c); };
  for (int T : {1, 7, 33, 300, 1000, 2500}) cl({DType::bf16, DType::f32, T, 4096, 3, {16, 8, 0, 13, 1}});
  cl({DType::f16, DType::f32, 300, 2056, 1, {64, 33, 0, 7}});
  cl({DType::bf16, DType::f32, 129, 72, 2, {16, 5, 0}});
  cl({DType::bf16, DType::f32, 700, 4096, 8, {16, 9, 0, 16}});
  cl({DType::f16, DType::f32, 257, 1024, 1, {100, 64, 0, 3}});
  cl({DType::bf16, DType::f32, 4000, 4096, 1, {64, 8, 16}});
  // Few tokens at rank 64 over 3 slices: narrow column groups (2 blocks of 8, 12 groups).
  cl({DType::bf16, DType::f32, 50, 4096, 3, {64, 17, 0}});
  cl({DType::f16, DType::f32, 16, 8200, 1, {64, 40}});
  std::vector<int> r32;
  for (int l = 0; l < 32; ++l) r32.push_back(l == 9 ? 0 : 1 + (l * 7) % 16);
  cl({DType::bf16, DType::f32, 256, 4096, 3, r32});
  ShrinkCase none{DType::bf16, DType::f32, 300, 4096, 2, {16, 8}};
  none.all_none = true;
  cl(none);
}

TEST(LoraShrink, WarpKTile) {
  using K = ShrinkKernel;
  auto wk = [](ShrinkCase c) { run_forced(K::fused_wk, c); };
  wk({DType::bf16, DType::f32, 300, 4096, 3, {16, 8, 0, 13, 1}});
  wk({DType::f16, DType::f32, 300, 192, 3, {16, 8, 0, 13, 1}});
  wk({DType::bf16, DType::f32, 1000, 4104, 1, {64, 33, 0, 7}});
  wk({DType::bf16, DType::f32, 300, 192, 2, {16, 5, 0}});
  wk({DType::bf16, DType::f32, 300, 4096, 3, {10, 3, 0}});
  wk({DType::f16, DType::f32, 77, 192, 3, {10, 3, 0}});
  run_forced_streamk_and_none(K::fused_wk);
}

// One 64-wide stage of one warpgroup through wg::Mma<bf16, 48> on tiles written in the swz() layout:
// d[64][48] = x[64][64] * a[48][64]^T, stored by the accumulator layout the shrink tile assumes.
// Pins the descriptor fields and the fragment layout apart from the pipeline.
__global__ void wgmma_unit_kernel(const __nv_bfloat16* x, const __nv_bfloat16* a, float* d) {
#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
  __trap();  // sm_90a only (the test skips elsewhere)
#else
  __shared__ __align__(128) uint8_t raw[64 * 128 + 48 * 128 + 1024];
  const uint32_t base = (lora_dev::smem_u32(raw) + 1023u) & ~1023u;
  uint8_t* sm = raw + (base - lora_dev::smem_u32(raw));
  const int tid = threadIdx.x;
  for (int c = tid; c < 64 * 8; c += 128)
    *reinterpret_cast<uint4*>(sm + lora_dev::swz(c / 8, c % 8) * 16) = *reinterpret_cast<const uint4*>(x + c * 8);
  for (int c = tid; c < 48 * 8; c += 128)
    *reinterpret_cast<uint4*>(sm + 8192 + lora_dev::swz(c / 8, c % 8) * 16) = *reinterpret_cast<const uint4*>(a + c * 8);
  wg::fence_proxy_async();
  __syncthreads();
  float acc[24] = {};
  wg::fence_operands(acc);
  wg::fence();
  const uint64_t dx = wg::desc_k128(base), da = wg::desc_k128(base + 8192);
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) wg::Mma<__nv_bfloat16, 48>::run(acc, dx + 2 * kk, da + 2 * kk);
  wg::commit();
  wg::wait<0>();
  wg::fence_operands(acc);
  const int w = tid >> 5, lane = tid & 31;
#pragma unroll
  for (int i = 0; i < 24; ++i) {
    const int row = 16 * w + (lane >> 2) + 8 * ((i >> 1) & 1), col = 8 * (i >> 2) + 2 * (lane & 3) + (i & 1);
    d[row * 48 + col] = acc[i];
  }
#endif
}

TEST(LoraShrink, WgmmaUnit) {
  if (!wgmma_available()) GTEST_SKIP() << "needs an sm_90 device and sm_90a code";
  HostTensor x = random_tensor(DType::bf16, 64 * 64, 7), a = random_tensor(DType::bf16, 48 * 64, 8);
  DeviceBuffer dx = to_device(x), da = to_device(a), dd(64 * 48 * 4);
  PUNICA_CUDA_CHECK(cudaMemset(dd.get(), 0xff, 64 * 48 * 4));  // NaN poison
  wgmma_unit_kernel<<<1, 128>>>(dx.as<__nv_bfloat16>(), da.as<__nv_bfloat16>(), dd.as<float>());
  PUNICA_CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<float> d(64 * 48);
  dd.download(d.data(), d.size() * 4);
  int bad = 0;
  for (int m = 0; m < 64; ++m)
    for (int n = 0; n < 48; ++n) {
      double ref = 0;
      for (int k = 0; k < 64; ++k) ref += double(x.get(m * 64 + k)) * double(a.get(n * 64 + k));
      const float got = d[m * 48 + n];
      if (!(std::fabs(got - ref) <= 1e-3 + 1e-3 * std::fabs(ref)) && bad++ < 8)
        ADD_FAILURE() << "d[" << m << "][" << n << "] = " << got << ", expected " << ref;
    }
  EXPECT_EQ(bad, 0);
}

// The wgmma tile (128 tokens; N = 16 * S * ceil(R/16) of 32, 48, 64 or 192): split-K,
// stream-K (T=8000), no split (K=192), a K % 64 tail, R = 10 (columns past R in the last group),
// mixed true ranks with NaN padding, every token without an adapter.
TEST(LoraShrink, WgmmaTile) {
  using K = ShrinkKernel;
  auto wg = [](ShrinkCase c) { run_forced(K::fused_wg, c); };
  wg({DType::bf16, DType::f32, 300, 4096, 3, {16, 8, 0, 13, 1}});   // N = 48
  wg({DType::f16, DType::f32, 300, 192, 3, {16, 8, 0, 13, 1}});
  wg({DType::bf16, DType::f32, 300, 192, 2, {16, 5, 0}});           // N = 32
  wg({DType::bf16, DType::f32, 1000, 4104, 1, {64, 33, 0, 7}});     // N = 64
  wg({DType::bf16, DType::f32, 500, 4096, 3, {64, 40, 0, 17}});     // N = 192
  wg({DType::bf16, DType::f32, 300, 4096, 3, {10, 3, 0}});          // R = 10
  wg({DType::bf16, DType::f32, 300, 4096, 3, {13, 5, 0}});          // R = 13: odd, scalar stores and atomics
  wg({DType::f16, DType::f32, 1000, 192, 3, {13, 5, 0}});           // odd R, no split
  run_forced_streamk_and_none(K::fused_wg);
  // the automatic path where shrink_heur::auto_wg takes the tile (qkv r=16 and r=64, 4 adapters)
  ASSERT_TRUE(shrink_heur::auto_wg(4096, 3, 16, 4) && shrink_heur::auto_wg(4096, 3, 64, 4));
  for (int R : {16, 64}) {
    ShrinkCase a{DType::bf16, DType::f32, 4096, 4096, 3, {R, R / 2, 0, 3}};
    a.nan_pad = true;
    run_case(a);
  }
}

// ---- perf: cold (256 MiB L2 flush before each launch) and back to back in a CUDA graph.
// none_pct: that share of the tokens has no adapter (the layer scenarios use 25).
void perf_shrink(int T, int64_t H, int R, int L, int S, int none_pct = 0) {
  const PerfBatch b(T, L, R, none_pct);
  DeviceBuffer x = to_device(random_tensor(DType::bf16, std::size_t(T) * H, 1));
  std::vector<DeviceBuffer> A;
  for (int s = 0; s < S; ++s) A.push_back(to_device(random_tensor(DType::bf16, std::size_t(L) * R * H, 2 + s, 0.1f)));
  DeviceBuffer y(std::size_t(S) * T * R * 4);
  DeviceBuffer flush(std::size_t(256) << 20);
  LoraShrinkArgs a;
  a.dtype = DType::bf16; a.num_tokens = T; a.hidden = H; a.x = x.get(); a.x_row_stride = H;
  a.num_slices = S; a.max_loras = L; a.max_rank = R; a.lora_ranks = b.ranks.as<int32_t>();
  a.meta = b.dm.view(); a.y = y.get(); a.scale = 0.5f;
  for (int s = 0; s < S; ++s) a.lora_a[s] = A[s].get();
  const int active = b.hm.num_active;
  const int64_t with_lora = b.with_lora;  // x rows that must be read
  const double floor_us =
      (double(active) * S * R * H * 2 + double(with_lora) * H * 2 + double(S) * T * R * 4) / 4.2e12 * 1e6;
  using K = ShrinkKernel;
  const K ks[] = {K::legacy, K::automatic, K::fused, K::fused_nosplit, K::fused_sk, K::fused128_sk,
                  K::fused_wk, K::fused_wg, K::cluster};  // cluster: auto where the tile cannot run
  char prefix[96];
  std::snprintf(prefix, sizeof prefix, "SHRINKPERF T=%-5d H=%lld r=%-3d L=%-2d S=%d none=%2d%%", T, (long long)H, R, L, S,
                none_pct);
  for (const auto& k : ks)
    perf_line(prefix, kind_name(k), floor_us, [&](cudaStream_t st) { launch_lora_shrink_with(a, k, st); },
              flush);
}

// Programmatic dependent launch: x is written by the kernel directly before the op, which must not
// read it before that kernel is done (every path: decode kernel, atomic GEMV behind its zero
// kernel, cluster tiles, the fused tiles with split-K / stream-K behind the zero kernel, warp-k,
// wgmma, and the legacy memset path).
TEST(LoraShrink, LateInputs) {
  using K = ShrinkKernel;
  auto late = [](ShrinkCase c, K kernel = K::automatic) {
    c.late = true;
    c.kernel = kernel;
    run_case(c);
  };
  for (int T : {1, 16, 64, 255, 2048, 8192}) {
    late({DType::bf16, DType::f32, T, 4096, 1, {16, 8, 0, 16}});
    late({DType::bf16, DType::f32, T, 4096, 3, {64, 8, 0, 40}});
    late({DType::bf16, DType::f32, T, 2048, 1, std::vector<int>(32, 64)});
  }
  for (K k : {K::legacy, K::fused, K::fused_sk, K::fused_wk, K::fused_wg, K::cluster, K::no_cluster})
    late({DType::bf16, DType::f32, 1000, 4096, 3, {16, 8, 0, 16}}, k);
  late({DType::f16, DType::f32, 3000, 2049, 1, {16, 8}});
  late({DType::bf16, DType::bf16, 300, 4096, 1, {16, 8}});
}

TEST(LoraShrinkPerf, DISABLED_Bf16) {
  for (int T : {8192})
    for (int R : {16, 64})
      for (int L : {8, 32})
        for (int S : {1, 3}) perf_shrink(T, 4096, R, L, S);
  for (int T : {1, 64})
    for (int S : {1, 3}) perf_shrink(T, 4096, 16, 8, S);
  perf_shrink(2048, 4096, 16, 8, 3);
  perf_shrink(4096, 4096, 64, 32, 3);
  perf_shrink(8192, 4096, 16, 8, 3, 25);  // the Llama-3-8B qkv layer's LoRA shrink (issue 4, tp 1 and 2)
  perf_shrink(8192, 4096, 64, 8, 3, 25);
  perf_shrink(8192, 4096, 16, 8, 2, 25);  // gate_up
  perf_shrink(8192, 8192, 16, 8, 1);
  perf_shrink(8192, 8192, 64, 8, 1);
  perf_shrink(16384, 4096, 16, 8, 3);
  perf_shrink(2048, 8192, 64, 32, 1);
  // just past decode: tiles of 64 tokens for few tokens and many adapters
  for (int T : {128, 256, 512, 1024})
    for (int L : {1, 8, 32}) {
      perf_shrink(T, 4096, 16, L, 1);
      perf_shrink(T, 8192, 64, L, 1);
      perf_shrink(T, 4096, 64, L, 3);
    }
}

// 256-1024 tokens, where back to back the shrink is furthest over its bound (NOTES v21): every
// kernel on the bench's rank-64 and qkv shapes, to see which one the automatic rule should take.
TEST(LoraShrinkPerf, DISABLED_MidBatch) {
  for (int T : {256, 512, 1024})
    for (int L : {1, 8, 32}) {
      perf_shrink(T, 4096, 64, L, 3);
      perf_shrink(T, 4096, 64, L, 1);
      perf_shrink(T, 8192, 64, L, 1);
      perf_shrink(T, 4096, 16, L, 3);
    }
}

}  // namespace
}  // namespace punica::kernels
