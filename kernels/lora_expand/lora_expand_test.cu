// GPU test of lora_expand (vLLM add_expand) against the Eigen reference: fp32 and 16-bit inputs
// (rounded to the weight dtype), mixed true ranks, -1 tokens left bit-equal, 1 and 3 unequal
// slices, offset_start > 0, add_inputs on/off, NaN in B's / x's padding, guarded y.
#include <gtest/gtest.h>
#include <cmath>
#include <numeric>
#include "kernels/lora_expand/expand_decode.h"
#include "kernels/lora_expand/heuristics.h"
#include "kernels/lora_expand/lora_expand.h"
#include "kernels/lora_expand/lora_expand_internal.h"
#include "kernels/common/test_util.h"
#include "reference/lora_reference.h"

namespace punica::kernels {
namespace {
using namespace testutil;

struct ExpandCase {
  DType dtype = DType::bf16;
  DType in = DType::f32;
  int T = 7;
  std::vector<int64_t> widths = {1024};
  std::vector<int> ranks = {16, 8, 0, 16};
  bool add = true;
  int64_t offset = 0;
  bool nan_pad = false;
  bool all_none = false;
  uint64_t seed = 3;
  int64_t ldy_pad = 24;  // y row stride = offset + sum N + ldy_pad
  ExpandPrefillKernel kernel = ExpandPrefillKernel::automatic;
  ExpandPrefillKernel expect = ExpandPrefillKernel::automatic;  // kernel it must reach
  bool decode_kernel = false;  // call the decode kernel directly (whatever the automatic choice)
  int expect_wide = -1;        // 0 / 1: expand_heur::decode_wide must say so for the case
  bool late = false;           // x and y written by the kernel directly before the op (testutil::late_copy)
  int hint = 0;                // num_active_loras (0 = not given)
};

void run_case(const ExpandCase& c) {
  SCOPED_TRACE(std::string(dtype_name(c.dtype)) + "/" + dtype_name(c.in) + " T=" + std::to_string(c.T) +
               " S=" + std::to_string(c.widths.size()) + " add=" + std::to_string(c.add) +
               " off=" + std::to_string(c.offset) + " kernel=" + std::to_string(int(c.kernel)));
  const int L = int(c.ranks.size());
  const int S = int(c.widths.size());
  const int R = *std::max_element(c.ranks.begin(), c.ranks.end());
  const int64_t total = std::accumulate(c.widths.begin(), c.widths.end(), int64_t(0));
  const int64_t ldy = c.offset + total + c.ldy_pad;
  const uint64_t key = hash_key(c.seed, hash_string("expand"), 0);
  std::vector<int32_t> map = c.all_none ? std::vector<int32_t>(std::size_t(c.T), -1) : make_mapping(c.T, c.ranks, key + 2);
  HostTensor x = random_tensor(c.in, std::size_t(S) * c.T * R, key + 1);
  std::vector<HostTensor> B;
  for (int s = 0; s < S; ++s) {
    B.push_back(random_tensor(c.dtype, std::size_t(L) * c.widths[s] * R, key + 10 + s, 0.25f));
    if (c.nan_pad)
      for (int l = 0; l < L; ++l)
        for (int64_t n = 0; n < c.widths[s]; ++n)
          for (int k = c.ranks[l]; k < R; ++k) B[s].set((std::size_t(l) * c.widths[s] + n) * R + k, NAN);
  }
  if (c.nan_pad)
    for (int s = 0; s < S; ++s)
      for (int t = 0; t < c.T; ++t)
        for (int k = map[t] < 0 ? 0 : c.ranks[map[t]]; k < R; ++k) x.set((std::size_t(s) * c.T + t) * R + k, NAN);
  const HostMeta hm = build_meta(map, L);
  DeviceMeta dm;
  upload_meta(dm, hm);
  std::vector<int32_t> ranks32(c.ranks.begin(), c.ranks.end());
  DeviceBuffer dranks(ranks32.size() * 4);
  dranks.upload(ranks32.data(), ranks32.size() * 4);
  // late: x and y hold other random values until the kernel before the op copies the real ones in.
  HostTensor x_other, y_other;
  DeviceBuffer dx = to_device(before_late(x, c.late, key + 101, x_other));
  std::vector<DeviceBuffer> dB;
  for (auto& b : B) dB.push_back(to_device(b));
  HostTensor y0 = random_tensor(c.dtype, std::size_t(c.T) * ldy, key + 5);
  Guarded gy(before_late(y0, c.late, key + 105, y_other));
  DeviceBuffer dx_real = c.late ? to_device(x) : DeviceBuffer(), dy_real = c.late ? to_device(y0) : DeviceBuffer();

  LoraExpandArgs a;
  a.in_dtype = c.in;
  a.dtype = c.dtype;
  a.num_tokens = c.T;
  a.x = dx.get();
  a.num_slices = S;
  for (int s = 0; s < S; ++s) { a.lora_b[s] = dB[s].get(); a.slice_width[s] = c.widths[s]; }
  a.max_loras = L;
  a.num_active_loras = c.hint;
  a.max_rank = R;
  a.lora_ranks = dranks.as<int32_t>();
  a.meta = dm.view();
  a.y = gy.ptr();
  a.y_row_stride = ldy;
  a.offset_start = c.offset;
  a.add_inputs = c.add;
  if (c.expect != ExpandPrefillKernel::automatic)
    EXPECT_EQ(int(detail::expand_prefill_kernel(a, c.kernel)), int(c.expect)) << "the case does not run the kernel it tests";
  if (c.expect_wide >= 0)
    EXPECT_EQ(expand_heur::decode_wide(c.T, a.slice_width, S, R), c.expect_wide == 1) << "the case does not take the block width it tests";
  TestStream ts;
  const cudaStream_t st = c.late ? ts.s : nullptr;
  if (c.late) late_copy({dx_real.get(), dx.get(), x.bytes.size()}, {dy_real.get(), gy.ptr(), y0.bytes.size()}, st);
  if (c.decode_kernel) detail::launch_expand_decode(a, st);
  else launch_lora_expand_with(a, c.kernel, st);
  PUNICA_CUDA_CHECK(cudaDeviceSynchronize());
  bool guards = false;
  HostTensor got = gy.download(guards);
  EXPECT_TRUE(guards) << "guard region overwritten";

  HostTensor ref = y0;
  LoraExpandArgs h = a;
  h.x = x.data();
  for (int s = 0; s < S; ++s) h.lora_b[s] = B[s].data();
  h.lora_ranks = ranks32.data();
  h.meta = LoraMetaView{hm.mapping.data(), hm.sorted.data(), hm.active.data(), hm.counts.data(),
                        hm.start.data(), &hm.no_lora, &hm.num_active};
  h.y = ref.data();
  ref::lora_expand(h);

  std::vector<uint8_t> check(y0.n, 0);
  std::size_t untouched_wrong = 0;
  for (int t = 0; t < c.T; ++t)
    for (int64_t col = 0; col < ldy; ++col) {
      const std::size_t i = std::size_t(t) * ldy + col;
      const bool inside = map[t] >= 0 && col >= c.offset && col < c.offset + total;
      if (inside) check[i] = 1;
      else if (got.bits(i) != y0.bits(i)) ++untouched_wrong;
    }
  EXPECT_EQ(untouched_wrong, 0u) << "-1 rows / columns outside the slices changed";
  std::string rep;
  EXPECT_EQ(compare(got, ref, rtol_for(c.dtype), check, rep, &y0), 0u) << rep;
}

TEST(LoraExpand, Bf16Decode) {
  for (int T : {0, 1, 7}) run_case({DType::bf16, DType::f32, T, {1024}, {16, 8, 0, 16}});
}
TEST(LoraExpand, Bf16Prefill) {
  run_case({DType::bf16, DType::f32, 300, {1024}, {16, 8, 0, 16}});
  run_case({DType::bf16, DType::bf16, 300, {1024}, {16, 8, 0, 16}});
}
TEST(LoraExpand, ThreeUnequalSlicesOffset) {
  for (int T : {7, 300})
    for (bool add : {true, false}) {
      ExpandCase c{DType::bf16, DType::f32, T, {1024, 256, 256}, {64, 33, 0, 1, 64}, add, 8};
      run_case(c);
    }
}
TEST(LoraExpand, Fp16) {
  for (int T : {1, 7, 300}) run_case({DType::f16, DType::f32, T, {1000, 256, 72}, {32, 12, 0, 32}, true, 3});
  run_case({DType::f16, DType::f16, 300, {512}, {16, 16}, false, 0});
}
TEST(LoraExpand, Fp32) {
  for (int T : {1, 7, 300}) run_case({DType::f32, DType::f32, T, {1024, 256}, {16, 3, 0, 16}, true, 5});
}
TEST(LoraExpand, Rank1) {
  for (int T : {1, 300}) run_case({DType::bf16, DType::f32, T, {1024}, {1, 1, 0}});
}
TEST(LoraExpand, Rank128And512) {
  run_case({DType::bf16, DType::f32, 300, {512, 256}, {128, 100, 0, 128}});
  run_case({DType::bf16, DType::f32, 7, {1024}, {512, 77, 512}});
  run_case({DType::f16, DType::f32, 200, {256}, {512, 300, 0}, false, 0});
}
TEST(LoraExpand, NanPadding) {
  for (int T : {7, 300}) {
    ExpandCase c{DType::bf16, DType::f32, T, {1024, 256, 256}, {64, 5, 0, 40}, true, 8};
    c.nan_pad = true;
    run_case(c);
  }
  ExpandCase c{DType::f16, DType::f16, 300, {300}, {32, 7, 0, 19}, false, 1};
  c.nan_pad = true;
  run_case(c);
}
// Decode kernel, both modes (one token per block with many adapters; token tiles with few), NaN
// padding, unequal slices, offset, add_inputs off, 16-bit x.
TEST(LoraExpand, DecodeManyAdapters) {
  for (int T : {16, 64, 128}) {
    ExpandCase c{DType::bf16, DType::f32, T, {4096, 1024, 1024}, testutil::many_ranks(), true, 0};
    c.nan_pad = true;
    run_case(c);
    ExpandCase d{DType::bf16, DType::bf16, T, {1000, 72}, {64, 16}, false, 3};
    d.nan_pad = true;
    run_case(d);
  }
  run_case({DType::f16, DType::f32, 64, {520}, {300, 12, 0}, true, 0});
  // 8 tokens per adapter at T = 64: the wide-N GEMV kernel.
  run_case({DType::bf16, DType::f32, 64, {1024, 256}, {16, 8, 0, 16, 64, 5, 33, 1}, true, 0});
}
// The decode kernel's per-token blocks at both widths (expand_heur::decode_wide, rank <= 16): odd
// slice widths past a block's columns, NaN padding, offsets, add_inputs off, fp32 / fp16 / bf16
// weights, 16-bit and fp32 x, more than 32 slots; rank 64 (always narrow); the narrow side of the
// boundary (T * chunks = 1024) beside it.
TEST(LoraExpand, DecodeWideBlocks) {
  auto dec = [](ExpandCase c, bool nan_pad, int wide) { c.nan_pad = nan_pad; c.decode_kernel = true; c.expect_wide = wide; return c; };
  run_case(dec({DType::bf16, DType::f32, 64, {1000, 72, 4095}, {16, 8, 0, 5}, true, 3}, true, 1));
  run_case(dec({DType::f16, DType::f16, 40, {4096}, {16, 13, 0, 7}, false, 0}, true, 1));
  run_case(dec({DType::f16, DType::f16, 40, {4096}, {64, 33, 0, 17}, false, 0}, true, 0));  // rank 64: narrow
  run_case(dec({DType::f32, DType::f32, 33, {2049}, {16, 3}, true, 0}, false, 1));
  std::vector<int> many16 = testutil::many_ranks();  // 40 slots, ranks <= 16
  for (int& r : many16) if (r > 16) r = 13;
  run_case(dec({DType::bf16, DType::bf16, 100, {1000, 256}, many16, true, 8}, true, 1));
  run_case(dec({DType::bf16, DType::bf16, 100, {1000, 256}, testutil::many_ranks(), true, 8}, true, 0));
  run_case(dec({DType::bf16, DType::f32, 16, {4096}, {16, 8, 0, 16}, true, 0}, true, 0));
  run_case(dec({DType::bf16, DType::f32, 17, {4096}, {16, 8, 0, 16}, true, 0}, true, 1));
}
// num_active_loras: one or two adapters in 32 slots, the hint exact (choices and grids plan for
// them): every automatic kernel the batch sizes reach, NaN padding, 1 and 3 unequal slices.
TEST(LoraExpand, ActiveLorasHint) {
  testutil::run_sparse_hint_cases<ExpandCase>([](const ExpandCase& c) { run_case(c); });
}
TEST(LoraExpand, AllTokensNone) {
  ExpandCase c{DType::bf16, DType::f32, 7, {1024}, {16, 8}, false, 0};
  c.all_none = true;
  run_case(c);
}

// Every prefill (mma) kernel on the awkward cases: NaN padding, ranks not multiples of 16, rank 0
// and rank 1 adapters, a partial 16-byte chunk at a slice end, unaligned slice columns (the staged
// kernel's scalar epilogue), several rank chunks, add_inputs off, fp32 / fp16 / bf16 x, column
// groups that end inside a slice, token tiles crossing adapters.
// Small batches through the mma kernels with an fp32 x: 32- and 16-row token tiles
// (expand_heur::small_bm), pipelined (rank <= 16) and streaming (rank > 16), NaN padding.
TEST(LoraExpand, SmallTokenTiles) {
  using K = ExpandPrefillKernel;
  auto run = [](ExpandCase c, K expect) {
    c.nan_pad = true;
    c.expect = expect;
    run_case(c);
  };
  run({DType::bf16, DType::f32, 64, {1024}, {16}, true, 0}, K::mma_pipe);  // 8 column tiles: 16-row tiles
  run({DType::bf16, DType::f32, 100, {1024, 256, 256}, {16, 8, 0, 16}, true, 8}, K::mma_pipe);
  run({DType::f16, DType::f32, 40, {1024}, {64, 40}, false, 0}, K::mma_stream);    // streaming, 16-row tiles
  run({DType::bf16, DType::f32, 300, {4096}, {64, 40}, true, 0}, K::mma_stream);   // streaming, 32-row tiles
  run({DType::bf16, DType::f32, 300, {4096}, {16, 5}, true, 0}, K::mma_pipe);      // pipelined, 32-row tiles
  // rank <= 16 above 128 tokens, <= 16 tokens per adapter (expand_heur::pipe16_few): 16-row tiles,
  // 32 adapters of ranks 0-16 over 3 unequal slices, and 20 adapters with add_inputs off
  std::vector<int> r32;
  for (int l = 0; l < 32; ++l) r32.push_back(l == 7 ? 0 : 1 + (l * 5) % 16);
  run({DType::bf16, DType::f32, 255, {4096, 1024, 1000}, r32, true, 0}, K::mma_pipe);
  run({DType::f16, DType::f32, 300, {2048}, std::vector<int>(r32.begin(), r32.begin() + 20), false, 0}, K::mma_pipe);
  // ... and from 64 tokens at 2 per adapter (expand_heur::small_batch_mma, v26): T = 64 / 128 over 32
  // adapters, 16-row tiles; T = 100 over 20 adapters with add_inputs off
  run({DType::bf16, DType::f32, 64, {4096, 1024, 1000}, r32, true, 0}, K::mma_pipe);
  run({DType::bf16, DType::f32, 128, {2048}, r32, true, 8}, K::mma_pipe);
  run({DType::f16, DType::f32, 100, {1000}, std::vector<int>(r32.begin(), r32.begin() + 20), false, 0}, K::mma_pipe);
}
// Few tokens per adapter above rank 16 through the automatic choice: the pipelined kernel with
// 16-row tiles (expand_heur::pipe_few_tokens): 32 adapters at T = 64 / 255 / 500 (up to 16 tokens
// per adapter; mixed ranks up to 64, one without rank, NaN padding, 3 unequal slices), one slice with
// a partial last column tile, add_inputs off, ranks 24 and 40 (rank chunks past the true rank), fp16.
TEST(LoraExpand, PipeFewTokens) {
  std::vector<int> r32;
  for (int l = 0; l < 32; ++l) r32.push_back(l == 5 ? 0 : 8 * (1 + (l * 3) % 8));
  for (int T : {64, 255}) {
    ExpandCase c{DType::bf16, DType::f32, T, {4096, 1024, 1000}, r32, true, 0};
    c.nan_pad = true;
    c.expect = ExpandPrefillKernel::mma_pipe;
    run_case(c);
  }
  // up to 16 tokens per adapter (the rule's bound): adapters with more than one 16-row tile
  ExpandCase e{DType::bf16, DType::f32, 500, {2048, 512, 504}, r32, true, 0};
  e.nan_pad = true;
  e.expect = ExpandPrefillKernel::mma_pipe;
  run_case(e);
  ExpandCase d{DType::f16, DType::f32, 100, {1000}, {24, 40, 8, 0, 40, 16, 24, 40, 8, 40, 16, 24, 40}, false, 0};
  d.nan_pad = true;
  d.expect = ExpandPrefillKernel::mma_pipe;
  run_case(d);
}
// One adapter at 16-48 tokens above rank 16 through the automatic choice: the pipelined 64 x 64
// kernel (expand_heur::one_adapter_pipe). Ranks 64 / 40 / 24 over 3, 1 and 2 unequal slices, T = 16 /
// 33 / 48, add_inputs on and off, bf16 and fp16, half the tokens without an adapter (NaN x rows);
// and the rule's edges, which keep the streaming kernel: T = 49, two adapters, and one adapter
// loaded in 32 slots with the caller's count (num_active_loras = 1; the other slots' B all NaN).
TEST(LoraExpand, OneAdapterPipe) {
  using K = ExpandPrefillKernel;
  struct P { DType dt; int T; std::vector<int64_t> w; int r; bool add; };
  for (const P& q : {P{DType::bf16, 16, {4096, 1024, 1000}, 64, true}, P{DType::f16, 33, {2056}, 40, false},
                     P{DType::bf16, 48, {1000, 520}, 24, true}}) {
    ExpandCase c{q.dt, DType::f32, q.T, q.w, {q.r}, q.add, 0};
    c.nan_pad = true;
    c.expect = K::mma_pipe;
    run_case(c);
  }
  ExpandCase one{DType::bf16, DType::f32, 32, {4096}, sparse_ranks(true), true, 0};
  one.nan_pad = true;
  one.hint = 1;
  one.expect = K::mma_stream;  // the rule counts slots: the pipelined grid has a row per slot
  run_case(one);
  ExpandCase edge{DType::bf16, DType::f32, 49, {4096}, {64}, true, 0};
  edge.nan_pad = true;
  edge.expect = K::mma_stream;
  run_case(edge);
  ExpandCase two{DType::bf16, DType::f32, 32, {4096}, {64, 40}, true, 0};
  two.nan_pad = true;
  two.expect = K::mma_stream;
  run_case(two);
}
TEST(LoraExpand, PrefillKernels) {
  using K = ExpandPrefillKernel;
  for (K k : {K::mma_staged, K::mma_stream, K::mma_pipe}) {
    // 16-byte rows and slice columns: every kernel applies (pipe only up to rank 64).
    ExpandCase a{DType::bf16, DType::f32, 1000, {1024, 256, 251}, {64, 5, 0, 40, 64}, true, 8};
    a.nan_pad = true;
    a.ldy_pad = 21;  // y row stride 1560: 16-byte rows, last slice ends inside a chunk
    a.kernel = k;
    a.expect = k;
    run_case(a);
    ExpandCase a16{DType::f16, DType::f16, 3001, {4096, 1000, 136}, {16, 8, 0, 16, 1, 16, 9}, false, 0};
    a16.nan_pad = true;
    a16.kernel = k;
    a16.expect = k;
    run_case(a16);
    ExpandCase big{DType::bf16, DType::f32, 600, {384, 128}, {200, 8, 0, 136}, true, 0};
    big.nan_pad = true;
    big.kernel = k;
    big.expect = k == K::mma_pipe ? K::mma_stream : k;  // rank 200: above the pipelined kernel
    run_case(big);
    // ranks 65-128 with an fp32 x: the pipelined kernel at RK = 128 (true ranks 1-128, rank 0, a
    // slice end inside a 64-column tile)
    ExpandCase r128{DType::bf16, DType::f32, 1000, {1000, 256, 136}, {128, 72, 0, 8, 1, 128, 100}, true, 8};
    r128.nan_pad = true;
    r128.ldy_pad = 16;
    r128.kernel = k;
    r128.expect = k;
    run_case(r128);
    ExpandCase r128h{DType::f16, DType::f32, 777, {520}, {96, 17, 128}, false, 0};
    r128h.kernel = k;
    r128h.expect = k;
    run_case(r128h);
    ExpandCase mid{DType::bf16, DType::bf16, 2500, {1536, 520}, {32, 24, 64, 0, 48}, true, 0};
    mid.kernel = k;
    mid.expect = k;
    run_case(mid);
    // Odd slice offset: only the staged kernel's scalar paths apply.
    ExpandCase b{DType::f16, DType::f16, 777, {1000, 256, 72}, {32, 12, 0, 32}, false, 3};
    b.nan_pad = true;
    b.kernel = k;
    b.expect = K::mma_staged;
    run_case(b);
  }
}

// The prefill kernels chosen explicitly at decode-sized T (1 to 128 tokens, fewer tokens than one
// tile, adapters with one token each): what the automatic choice may route there.
TEST(LoraExpand, PrefillKernelsSmallBatch) {
  using K = ExpandPrefillKernel;
  for (K k : {K::mma_staged, K::mma_stream, K::mma_pipe})
    for (int T : {1, 7, 64, 128}) {
      ExpandCase c{DType::bf16, DType::f32, T, {4096, 1024, 1024}, {64, 5, 0, 40, 64}, true, 0};
      c.nan_pad = true;
      c.kernel = k;
      c.expect = k;
      run_case(c);
      ExpandCase d{DType::f16, DType::f16, T, {1000}, testutil::many_ranks(), false, 0};
      d.nan_pad = true;
      d.kernel = k;
      d.expect = k;
      run_case(d);
      ExpandCase e{DType::bf16, DType::f32, T, {1000, 256}, {128, 72, 0}, true, 0};  // RK = 128 (pipe)
      e.nan_pad = true;
      e.kernel = k;
      e.expect = k;
      run_case(e);
    }
}

// Above rank 64 the streaming kernel holds two rank chunks (expand_heur::stream_chunks) in each of
// its tile heights, through the automatic choice: 16-row (T=48) and 32-row (T=300) tiles with an
// fp32 x, 64-row tiles with a 16-bit x; true ranks that end inside a chunk, odd chunk counts, rank
// 0, a rank-512 batch, NaN padding, unequal slices with partial column tiles.
TEST(LoraExpand, StreamTwoChunks) {
  using K = ExpandPrefillKernel;
  for (int T : {48, 300}) {
    ExpandCase c{DType::bf16, DType::f32, T, {1000, 136}, {256, 200, 0, 33, 129}, true, 8};
    c.nan_pad = true;
    c.expect = K::mma_stream;
    run_case(c);
  }
  ExpandCase h{DType::f16, DType::f16, 1500, {520, 384}, {136, 65, 0, 96}, false, 0};
  h.nan_pad = true;
  h.expect = K::mma_stream;
  run_case(h);
  ExpandCase big{DType::bf16, DType::f32, 700, {768}, {512, 1, 300, 64}, true, 0};
  big.nan_pad = true;
  big.expect = K::mma_stream;
  run_case(big);
  for (int R : {72, 96, 128, 256}) EXPECT_EQ(expand_heur::stream_chunks(R), 2) << R;
  for (int R : {16, 32, 64}) EXPECT_EQ(expand_heur::stream_chunks(R), 1) << R;
}

// Prefill-sized batch close to the timed shape: 3 unequal slices, 8 adapters + -1 tokens; and a
// rank-64 one with 32 adapters (both through the automatic choice: the pipelined kernel).
TEST(LoraExpand, LargePrefillThreeSlices) {
  ExpandCase c{DType::bf16, DType::f32, 8190, {4096, 1024, 1024}, {16, 16, 16, 16, 8, 16, 16, 16}, true, 0};
  c.ldy_pad = 0;
  c.expect = ExpandPrefillKernel::mma_pipe;
  run_case(c);
  ExpandCase d{DType::bf16, DType::f32, 4099, {4096, 1024, 1024}, std::vector<int>(32, 64), true, 0};
  d.nan_pad = true;
  d.expect = ExpandPrefillKernel::mma_pipe;
  run_case(d);
  // ranks 8 / 32 / 128 mixed (the off-grid bench's set), 3 slices: the rank-128 pipelined kernel
  ExpandCase m{DType::bf16, DType::f32, 3001, {3584, 512, 512}, {8, 32, 128, 128, 32, 8, 0, 128}, true, 0};
  m.nan_pad = true;
  m.expect = ExpandPrefillKernel::mma_pipe;
  run_case(m);
}

// From 4096 tokens above rank 16, the pipelined kernel's dual form (expand_heur::pipe_dual): the
// blocks of adapters with rank <= 16 take 64 x 128 tiles over the 64 x 64 kernel's column groups,
// the others 64 x 64 tiles. Mixed ranks 0-64 in one batch, NaN padding, tokens without adapter, a
// slice of 15 64-column tiles (an odd count at its end: the last 128-column tile clipped) and one of
// 72 columns, an offset and a row pad; bf16 and fp16, with and without add_inputs.
TEST(LoraExpand, DualTilesMixedRanks) {
  for (DType dt : {DType::bf16, DType::f16})
    for (bool add : {true, false}) {
      ExpandCase c{dt, DType::f32, 4099, {4096, 960, 72}, {64, 8, 16, 0, 40, 16, 1, 64, 12}, add, 8};
      c.nan_pad = true;
      c.ldy_pad = 16;
      c.expect = ExpandPrefillKernel::mma_pipe;
      ASSERT_TRUE(expand_heur::pipe_dual(c.T)) << "the case does not reach the dual kernel";
      run_case(c);
    }
}

// The 64 x 64 pipelined kernel with more than kPipeTiles64 column tiles per block where they make
// one wave (expand_heur::pipe_ntb's one_wave_max): 129 column tiles (the last 8 columns wide) of one
// slice, 2047 tokens over 4 slots of ranks 64 / 40 / none / 64. On 396 slots (132 SMs x 3) the wave
// fit wants 11 tiles per block, so the groups are 11 x 11 + 8.
TEST(LoraExpand, OneWaveTiles) {
  const int64_t ct[] = {(8200 + 63) / 64};
  ASSERT_GT(expand_heur::pipe_ntb(ct, 1, expand_heur::pipe_token_tiles(2047, 4, 64), 396, expand_heur::kPipeTiles64,
                                  expand_heur::kPipeTiles64OneWave),
            expand_heur::kPipeTiles64)
      << "the case does not reach the longer blocks";
  for (DType dt : {DType::bf16, DType::f16})
    for (bool add : {true, false}) {
      ExpandCase c{dt, DType::f32, 2047, {8200}, {64, 40, 0, 64}, add, 0};
      c.nan_pad = true;
      c.expect = ExpandPrefillKernel::mma_pipe;
      ASSERT_FALSE(expand_heur::pipe_dual(c.T)) << "the case must run the plain 64 x 64 kernel";
      run_case(c);
    }
}

// The rank <= 16 kernel with 16-row token tiles and 4 column tiles per block where the wave fit's 3
// spill past one wave through each slice's rounding (expand_heur::kPipe16FewOneWave, with the
// num_active_loras hint): 32 adapters of ranks 16 / 8 / none at T = 255 (8 tokens each), 3 unequal
// slices (32 / 8 / 8 column tiles, the last partial). On 528 slots (132 SMs x 4) 3 tiles per block
// give 544 blocks, 4 give 384. Without the hint (3 tiles) too.
TEST(LoraExpand, Pipe16RoundSpill) {
  const int64_t ct[] = {32, 8, 8};
  ASSERT_EQ(expand_heur::pipe_ntb(ct, 3, expand_heur::pipe_token_tiles(255, 32, 16), 528, expand_heur::pipe_tiles16(3),
                                  expand_heur::kPipe16FewOneWave, true),
            4)
      << "the case does not reach the longer blocks";
  std::vector<int> r32;
  for (int l = 0; l < 32; ++l) r32.push_back(l % 7 == 3 ? 0 : (l % 2 ? 8 : 16));
  for (DType dt : {DType::bf16, DType::f16})
    for (bool add : {true, false}) {
      for (int hint : {32, 0}) {
        ExpandCase c{dt, DType::f32, 255, {4096, 1024, 1000}, r32, add, 0};
        c.nan_pad = true;
        c.hint = hint;
        c.expect = ExpandPrefillKernel::mma_pipe;
        ASSERT_TRUE(expand_heur::pipe16_few(c.T, 32)) << "the case must take the 16-row tiles";
        run_case(c);
      }
    }
}

// ---- perf: cold (256 MiB memset before each launch) and back to back in a CUDA graph; the
// prefill kernels on the layer and bench shapes. none_pct: share of tokens without adapter.
void perf_expand(int T, std::vector<int64_t> widths, int R, int L, int none_pct) {
  const int S = int(widths.size());
  const PerfBatch b(T, L, R, none_pct);
  const int64_t total = std::accumulate(widths.begin(), widths.end(), int64_t(0));
  DeviceBuffer x = to_device(random_tensor(DType::f32, std::size_t(S) * T * R, 1));
  std::vector<DeviceBuffer> B;
  for (int s = 0; s < S; ++s)
    B.push_back(to_device(random_tensor(DType::bf16, std::size_t(L) * widths[s] * R, 2 + s, 0.1f)));
  DeviceBuffer y = to_device(random_tensor(DType::bf16, std::size_t(T) * total, 9));
  DeviceBuffer flush(std::size_t(256) << 20);
  LoraExpandArgs a;
  a.in_dtype = DType::f32; a.dtype = DType::bf16; a.num_tokens = T; a.x = x.get(); a.num_slices = S;
  for (int s = 0; s < S; ++s) { a.lora_b[s] = B[s].get(); a.slice_width[s] = widths[s]; }
  a.max_loras = L; a.max_rank = R; a.lora_ranks = b.ranks.as<int32_t>(); a.meta = b.dm.view();
  a.y = y.get(); a.y_row_stride = total; a.offset_start = 0; a.add_inputs = true;
  const int64_t with_lora = b.with_lora;
  const double floor_us = (double(b.hm.num_active) * total * R * 2 + double(S) * T * R * 4 +
                           2.0 * double(with_lora) * total * 2) / 4.2e12 * 1e6;
  using K = ExpandPrefillKernel;
  const std::pair<K, const char*> ks[] = {{K::automatic, "auto"}, {K::mma_pipe, "pipe"}, {K::mma_stream, "stream"}};
  char prefix[96];
  std::snprintf(prefix, sizeof prefix, "EXPANDPERF T=%-5d N=%-5lld S=%d r=%-2d L=%-2d none=%2d%%", T, (long long)total, S,
                R, L, none_pct);
  for (const auto& k : ks)
    perf_line(prefix, k.second, floor_us, [&](cudaStream_t st) { launch_lora_expand_with(a, k.first, st); },
              flush);
}

// Programmatic dependent launch: x and y are written by the kernel directly before the op, which
// must wait for it before reading them (every path: decode kernels, small-batch streaming and
// pipelined tiles, the prefill pipelined kernel, the staged kernel, 3 slices).
TEST(LoraExpand, LateInputs) {
  using K = ExpandPrefillKernel;
  auto late = [](ExpandCase c, K kernel = K::automatic, K expect = K::automatic) {
    c.late = true;
    c.kernel = kernel;
    c.expect = expect;
    run_case(c);
  };
  for (int T : {1, 16, 64, 255, 2048}) {
    late({DType::bf16, DType::f32, T, {1024}, {16, 8, 0, 16}, true, 0});
    late({DType::bf16, DType::f32, T, {1024}, {64, 8, 0, 40}, true, 0});
    late({DType::bf16, DType::f32, T, {512, 128, 136}, {16, 0, 16}, true, 24});
  }
  late({DType::bf16, DType::bf16, 700, {1024}, {16, 8, 0, 16}, true, 0});
  late({DType::bf16, DType::f32, 300, {1024}, {128, 8}, true, 0});  // the streaming kernel above rank 64
  late({DType::bf16, DType::f32, 700, {1024, 520}, {128, 8, 0}, true, 0}, K::automatic, K::mma_pipe);  // RK = 128
  late({DType::bf16, DType::f32, 300, {1024}, {16, 8}, true, 0}, K::mma_staged, K::mma_staged);
  late({DType::bf16, DType::f32, 300, {1024}, {64, 8}, true, 0}, K::mma_stream, K::mma_stream);
  late({DType::f16, DType::f32, 300, {1024}, {64, 8}, true, 0}, K::mma_pipe, K::mma_pipe);
  late({DType::bf16, DType::f32, 255, {1024}, std::vector<int>(32, 64), true, 0}, K::automatic, K::mma_pipe);
  ExpandCase d{DType::bf16, DType::f32, 64, {1024}, {16, 8, 0, 16}, true, 0};
  d.decode_kernel = true;
  late(d);
}

// The layer and bench prefill shapes alone (a short run for A/Bs of the prefill kernels).
TEST(LoraExpandPerf, DISABLED_PrefillShapes) {
  perf_expand(8192, {2048, 512, 512}, 16, 8, 25);   // Llama-3-8B qkv layer, tp 2
  perf_expand(8192, {4096, 1024, 1024}, 16, 8, 25); // tp 1
  perf_expand(8192, {4096, 1024, 1024}, 16, 8, 0);  // bench qkv
  perf_expand(8192, {4096}, 16, 8, 0);              // bench one slice
  perf_expand(8192, {4096}, 64, 8, 0);
}

// 256-1024 tokens (as LoraShrinkPerf.DISABLED_MidBatch): the automatic choice against each kernel.
TEST(LoraExpandPerf, DISABLED_MidBatch) {
  for (int T : {256, 512, 1024})
    for (int L : {1, 8, 32}) {
      perf_expand(T, {4096, 1024, 1024}, 16, L, 0);
      perf_expand(T, {4096, 1024, 1024}, 64, L, 0);
      perf_expand(T, {4096}, 64, L, 0);
      perf_expand(T, {8192}, 16, L, 0);
      perf_expand(T, {8192}, 64, L, 0);
    }
}

TEST(LoraExpandPerf, DISABLED_Bf16) {
  perf_expand(8192, {2048, 512, 512}, 16, 8, 25);   // Llama-3-8B qkv layer, tp 2
  perf_expand(8192, {4096, 1024, 1024}, 16, 8, 25); // tp 1
  perf_expand(8192, {7168, 7168}, 16, 8, 25);       // gate_up, tp 2
  for (int R : {16, 64})
    for (int L : {8, 32}) {
      perf_expand(8192, {4096, 1024, 1024}, R, L, 0);
      perf_expand(8192, {4096}, R, L, 0);
    }
  perf_expand(8192, {8192}, 16, 8, 0);
  perf_expand(2048, {4096, 1024, 1024}, 16, 8, 0);
  perf_expand(2048, {8192}, 64, 32, 0);
  perf_expand(512, {4096}, 16, 8, 0);
  // decode-sized and small prefill batches: the decode kernel (auto up to T=128) against the
  // prefill kernels
  for (int T : {16, 32, 64, 128, 256, 512, 1024, 2048})
    for (int L : {1, 8, 32}) {
      perf_expand(T, {4096}, 16, L, 0);
      perf_expand(T, {8192}, 64, L, 0);
      perf_expand(T, {4096, 1024, 1024}, 64, L, 0);
    }
}

}  // namespace
}  // namespace punica::kernels
