// GPU test of add_lora_linear (vLLM add_lora_linear) against the Eigen reference with the rounded
// intermediate, both paths (decode partials + PDL expand, prefill shrink -> expand), and a disabled
// LoraPerf suite that times shrink / expand / add_lora_linear cold and back to back (CUDA graph)
// against the byte floor (run with --gtest_also_run_disabled_tests --gtest_filter='*Perf*').
#include <gtest/gtest.h>
#include <algorithm>
#include <cmath>
#include <functional>
#include <cstdio>
#include <numeric>
#include <utility>
#include "kernels/add_lora_linear/add_lora_linear.h"
#include "kernels/add_lora_linear/add_lora_linear_internal.h"
#include "kernels/add_lora_linear/heuristics.h"
#include "kernels/lora_expand/lora_expand.h"
#include "kernels/lora_expand/lora_expand_internal.h"
#include "kernels/lora_shrink/lora_shrink.h"
#include "kernels/common/test_util.h"
#include "reference/lora_reference.h"

namespace punica::kernels {
namespace {
using namespace testutil;

struct LinearCase {
  DType dtype = DType::bf16;
  int T = 7;
  int64_t K = 4096;
  std::vector<int64_t> widths = {1024};
  std::vector<int> ranks = {16, 8, 0, 16};
  bool add = true;
  bool nan_pad = false;
  float scale = 0.5f;
  uint64_t seed = 5;
  detail::LinearPath path = detail::LinearPath::automatic;
  bool late = false;  // x and y written by the kernel directly before the op (testutil::late_copy)
  bool twice = false;  // the op twice in a row on one stream (the second adds its product again)
  int hint = 0;        // num_active_loras (0 = not given)
};

void run_case(const LinearCase& c) {
  SCOPED_TRACE(std::string(dtype_name(c.dtype)) + " path=" + std::to_string(int(c.path)) + " T=" + std::to_string(c.T) + " K=" + std::to_string(c.K) +
               " S=" + std::to_string(c.widths.size()) + " add=" + std::to_string(c.add) + " late=" + std::to_string(c.late) +
               " twice=" + std::to_string(c.twice));
  const int L = int(c.ranks.size());
  const int S = int(c.widths.size());
  const int R = *std::max_element(c.ranks.begin(), c.ranks.end());
  const int64_t total = std::accumulate(c.widths.begin(), c.widths.end(), int64_t(0));
  const int64_t ldy = total + 16;
  const uint64_t key = hash_key(c.seed, hash_string("linear"), 0);
  std::vector<int32_t> map = make_mapping(c.T, c.ranks, key + 2);
  HostTensor x = random_tensor(c.dtype, std::size_t(c.T) * c.K, key + 1);
  std::vector<HostTensor> A, B;
  for (int s = 0; s < S; ++s) {
    A.push_back(random_tensor(c.dtype, std::size_t(L) * R * c.K, key + 10 + s, 0.25f));
    B.push_back(random_tensor(c.dtype, std::size_t(L) * c.widths[s] * R, key + 20 + s, 0.25f));
    if (c.nan_pad)
      for (int l = 0; l < L; ++l) {
        for (int j = c.ranks[l]; j < R; ++j)
          for (int64_t k = 0; k < c.K; ++k) A[s].set((std::size_t(l) * R + j) * c.K + k, NAN);
        for (int64_t n = 0; n < c.widths[s]; ++n)
          for (int k = c.ranks[l]; k < R; ++k) B[s].set((std::size_t(l) * c.widths[s] + n) * R + k, NAN);
      }
  }
  const HostMeta hm = build_meta(map, L);
  DeviceMeta dm;
  upload_meta(dm, hm);
  std::vector<int32_t> ranks32(c.ranks.begin(), c.ranks.end());
  DeviceBuffer dranks(ranks32.size() * 4);
  dranks.upload(ranks32.data(), ranks32.size() * 4);
  // late: x and y hold other random values until the kernel before the op copies the real ones in.
  HostTensor x_other, y_other;
  DeviceBuffer dx = to_device(before_late(x, c.late, key + 101, x_other));
  std::vector<DeviceBuffer> dA, dB;
  for (auto& a : A) dA.push_back(to_device(a));
  for (auto& b : B) dB.push_back(to_device(b));
  HostTensor y0 = random_tensor(c.dtype, std::size_t(c.T) * ldy, key + 5);
  Guarded gy(before_late(y0, c.late, key + 105, y_other));
  DeviceBuffer dx_real = c.late ? to_device(x) : DeviceBuffer(), dy_real = c.late ? to_device(y0) : DeviceBuffer();
  DeviceBuffer ws(std::max<std::size_t>(add_lora_linear_workspace_bytes(c.T, S, R), 16));
  PUNICA_CUDA_CHECK(cudaMemset(ws.get(), 0xff, ws.bytes()));  // NaN garbage: must not leak

  AddLoraLinearArgs a;
  a.dtype = c.dtype;
  a.num_tokens = c.T;
  a.hidden = c.K;
  a.x = dx.get();
  a.x_row_stride = c.K;
  a.num_slices = S;
  for (int s = 0; s < S; ++s) {
    a.lora_a[s] = dA[s].get();
    a.lora_b[s] = dB[s].get();
    a.slice_width[s] = c.widths[s];
  }
  a.max_loras = L;
  a.num_active_loras = c.hint;
  a.max_rank = R;
  a.lora_ranks = dranks.as<int32_t>();
  a.meta = dm.view();
  a.scale = c.scale;
  a.y = gy.ptr();
  a.y_row_stride = ldy;
  a.add_inputs = c.add;
  a.workspace = ws.get();
  TestStream ts;
  const cudaStream_t st = c.late || c.twice ? ts.s : nullptr;
  if (c.late) late_copy({dx_real.get(), dx.get(), x.bytes.size()}, {dy_real.get(), gy.ptr(), y0.bytes.size()}, st);
  detail::launch_add_lora_linear_with(a, c.path, st);
  if (c.twice) detail::launch_add_lora_linear_with(a, c.path, st);
  PUNICA_CUDA_CHECK(cudaDeviceSynchronize());
  bool guards = false;
  HostTensor got = gy.download(guards);
  EXPECT_TRUE(guards) << "guard region overwritten";

  HostTensor ref = y0;
  AddLoraLinearArgs h = a;
  h.x = x.data();
  for (int s = 0; s < S; ++s) { h.lora_a[s] = A[s].data(); h.lora_b[s] = B[s].data(); }
  h.lora_ranks = ranks32.data();
  h.meta = LoraMetaView{hm.mapping.data(), hm.sorted.data(), hm.active.data(), hm.counts.data(),
                        hm.start.data(), &hm.no_lora, &hm.num_active};
  h.y = ref.data();
  h.workspace = nullptr;
  ref::RefOptions o;
  o.round_intermediate = true;
  ref::add_lora_linear(h, o);
  if (c.twice) ref::add_lora_linear(h, o);

  std::vector<uint8_t> check(y0.n, 0);
  std::size_t untouched_wrong = 0;
  for (int t = 0; t < c.T; ++t)
    for (int64_t col = 0; col < ldy; ++col) {
      const std::size_t i = std::size_t(t) * ldy + col;
      if (map[t] >= 0 && col < total) check[i] = 1;
      else if (got.bits(i) != y0.bits(i)) ++untouched_wrong;
    }
  EXPECT_EQ(untouched_wrong, 0u) << "-1 rows / columns outside the slices changed";
  std::string rep;
  // twice: two roundings of y (each within rtol of the reference's) in a row; a call that ran
  // before the other finished would be off by a whole product (|P| ~ rms), far above 2 rtol.
  EXPECT_EQ(compare(got, ref, (c.twice ? 2.0 : 1.0) * rtol_for(c.dtype), check, rep, &y0), 0u) << rep;
}

TEST(AddLoraLinear, Bf16Decode) {
  for (int T : {0, 1, 7}) run_case({DType::bf16, T, 4096, {1024}, {16, 8, 0, 16}});
}
TEST(AddLoraLinear, Bf16Prefill) { run_case({DType::bf16, 300, 4096, {1024}, {16, 8, 0, 16}}); }
TEST(AddLoraLinear, QkvMixedRanks) {
  for (int T : {7, 300})
    for (bool add : {true, false}) run_case({DType::bf16, T, 4096, {1024, 256, 256}, {64, 33, 0, 1, 64}, add});
}
TEST(AddLoraLinear, Fp16Hidden2049) {
  for (int T : {1, 7, 300}) run_case({DType::f16, T, 2049, {1024, 256, 256}, {32, 12, 0, 32}});
}
TEST(AddLoraLinear, Fp32) {
  for (int T : {1, 7, 300}) run_case({DType::f32, T, 2049, {512, 256}, {16, 3, 0, 16}});
}
TEST(AddLoraLinear, Rank1And512) {
  run_case({DType::bf16, 300, 4096, {1024}, {1, 1, 0}});
  run_case({DType::bf16, 7, 2049, {1024}, {512, 77, 512}});
  run_case({DType::bf16, 200, 1024, {256}, {512, 300, 0}});
}
TEST(AddLoraLinear, NanPadding) {
  for (int T : {7, 300}) {
    LinearCase c{DType::bf16, T, 4096, {1024, 256, 256}, {64, 5, 0, 40}};
    c.nan_pad = true;
    run_case(c);
  }
}

TEST(AddLoraLinear, DecodeManyAdapters) {
  for (int T : {16, 64, 128}) {
    LinearCase c{DType::bf16, T, 4096, {4096, 1024, 1024}, testutil::many_ranks()};
    c.nan_pad = true;
    run_case(c);
    run_case({DType::bf16, T, 2049, {1000}, {64, 16}, false});
  }
  // 8 tokens per adapter at T = 64, r <= 16: the split-K partials path.
  run_case({DType::bf16, 64, 4096, {1024, 256}, {16, 8, 0, 16, 16, 5, 12, 1}});
}
// Few tokens per adapter above rank 16 (the expand's 16-row pipelined tiles, after the shrink):
// 32 adapters, T = 64 / 256 / 500 (500: ~16 per adapter, some adapters with two 16-row tiles),
// mixed ranks with NaN padding, 3 unequal slices.
TEST(AddLoraLinear, FewTokensPerAdapter) {
  std::vector<int> r32;
  for (int l = 0; l < 32; ++l) r32.push_back(l == 7 ? 0 : 8 * (1 + (l * 5) % 8));
  for (int T : {64, 256, 500}) {
    LinearCase c{DType::bf16, T, 4096, {4096, 1024, 1000}, r32};
    c.nan_pad = true;
    run_case(c);
  }
}
// num_active_loras: one or two adapters in 32 slots, the hint exact (the paths the automatic rule
// takes with the hint), NaN padding, 1 and 3 unequal slices.
TEST(AddLoraLinear, ActiveLorasHint) {
  testutil::run_sparse_hint_cases<LinearCase>([](const LinearCase& c) { run_case(c); });
}
// Every path at every batch size it serves (decode and partials up to 128 tokens, tiles at any
// T): mixed ranks with NaN padding, 3 unequal slices, add_inputs off, fp16.
TEST(AddLoraLinear, EveryPath) {
  using P = detail::LinearPath;
  for (P path : {P::decode, P::partials, P::tiles})
    for (int T : {1, 7, 64, 128, 300}) {
      LinearCase c{DType::bf16, T, 4096, {1024, 256, 256}, {64, 5, 0, 40, 16}};
      c.nan_pad = true;
      c.path = path;
      run_case(c);
      LinearCase d{DType::f16, T, 2048, {1000}, {16, 8, 0, 16}, false};
      d.path = path;
      run_case(d);
    }
}

// ------------------------------------------------------------------------------------ timing
// blocked: token t uses adapter t * L / T (requests contiguous, as in vLLM prefill) instead of a
// random adapter per token; separates the kernels' cost from that of the scattered row gather.
// none_pct: that share of the tokens (by hash) has no adapter, as in the layer scenarios (25).
struct PerfShape {
  int T; int64_t H; int r; int adapters; std::vector<int64_t> widths; bool blocked = false; int none_pct = 0;
};

void perf_shape(const PerfShape& p) {
  const double bw = 4.3e12;
  const int L = std::max(p.adapters, 1);
  const int S = int(p.widths.size());
  const int64_t total = std::accumulate(p.widths.begin(), p.widths.end(), int64_t(0));
  const int R = p.r;
  std::vector<int32_t> map(static_cast<std::size_t>(p.T));
  for (int t = 0; t < p.T; ++t)
    map[std::size_t(t)] = hash_below(91, uint64_t(t), 100) < uint64_t(p.none_pct) ? -1
                          : p.blocked ? int32_t(int64_t(t) * L / p.T)
                                      : int32_t(hash_below(77, uint64_t(t), uint64_t(L)));
  const double nrows = double(std::count_if(map.begin(), map.end(), [](int32_t v) { return v >= 0; }));
  const HostMeta hm = build_meta(map, L);
  const int active = hm.num_active;
  DeviceMeta dm;
  upload_meta(dm, hm);
  std::vector<int32_t> ranks(std::size_t(L), R);
  DeviceBuffer dranks(ranks.size() * 4);
  dranks.upload(ranks.data(), ranks.size() * 4);
  DeviceBuffer x = to_device(random_tensor(DType::bf16, std::size_t(p.T) * p.H, 1));
  std::vector<DeviceBuffer> A, B;
  for (int s = 0; s < S; ++s) {
    A.push_back(to_device(random_tensor(DType::bf16, std::size_t(L) * R * p.H, 2 + s, 0.1f)));
    B.push_back(to_device(random_tensor(DType::bf16, std::size_t(L) * p.widths[s] * R, 20 + s, 0.1f)));
  }
  DeviceBuffer y = to_device(random_tensor(DType::bf16, std::size_t(p.T) * total, 3));
  DeviceBuffer mid(std::size_t(S) * p.T * R * 4);
  DeviceBuffer ws(add_lora_linear_workspace_bytes(p.T, S, R));
  DeviceBuffer flush(std::size_t(256) << 20);

  LoraShrinkArgs sa;
  sa.dtype = DType::bf16; sa.num_tokens = p.T; sa.hidden = p.H; sa.x = x.get(); sa.x_row_stride = p.H;
  sa.num_slices = S; sa.max_loras = L; sa.max_rank = R; sa.lora_ranks = dranks.as<int32_t>();
  sa.meta = dm.view(); sa.y = mid.get();
  LoraExpandArgs ea;
  ea.dtype = DType::bf16; ea.in_dtype = DType::f32; ea.num_tokens = p.T; ea.x = mid.get(); ea.num_slices = S;
  ea.max_loras = L; ea.max_rank = R; ea.lora_ranks = dranks.as<int32_t>(); ea.meta = dm.view();
  ea.y = y.get(); ea.y_row_stride = total;
  AddLoraLinearArgs la;
  la.dtype = DType::bf16; la.num_tokens = p.T; la.hidden = p.H; la.x = x.get(); la.x_row_stride = p.H;
  la.num_slices = S; la.max_loras = L; la.max_rank = R; la.lora_ranks = dranks.as<int32_t>();
  la.meta = dm.view(); la.y = y.get(); la.y_row_stride = total; la.workspace = ws.get();
  for (int s = 0; s < S; ++s) {
    sa.lora_a[s] = A[s].get(); la.lora_a[s] = A[s].get();
    ea.lora_b[s] = B[s].get(); la.lora_b[s] = B[s].get();
    ea.slice_width[s] = p.widths[s]; la.slice_width[s] = p.widths[s];
  }
  const double fs = (double(active) * S * R * p.H * 2 + nrows * p.H * 2 + double(S) * p.T * R * 4) / bw * 1e6;
  const double fe = (double(active) * R * total * 2 + double(S) * nrows * R * 4 + 2.0 * nrows * total * 2) / bw * 1e6;
  const double fl = (double(active) * S * R * p.H * 2 + nrows * p.H * 2 + double(active) * R * total * 2 +
                     2.0 * nrows * total * 2) / bw * 1e6;
  auto sh = [&](cudaStream_t st) { launch_lora_shrink(sa, st); };
  auto ex = [&](cudaStream_t st) { launch_lora_expand(ea, st); };
  auto both = [&](cudaStream_t st) { launch_lora_shrink(sa, st); launch_lora_expand(ea, st); };
  auto lin = [&](cudaStream_t st) { launch_add_lora_linear(la, st); };
  for (int i = 0; i < 3; ++i) { sh(nullptr); ex(nullptr); lin(nullptr); }
  PUNICA_CUDA_CHECK(cudaDeviceSynchronize());
  struct Row { const char* name; double floor, cold, graph; };
  Row rows[] = {{"shrink", fs, cold_us(sh, flush), graph_us(sh, 20, 7)},
                {"expand", fe, cold_us(ex, flush), graph_us(ex, 20, 7)},
                {"shrink+expand", fl, cold_us(both, flush), graph_us(both, 20, 7)},
                {"add_lora_linear", fl, cold_us(lin, flush), graph_us(lin, 20, 7)}};
  if (p.none_pct > 0) {  // the layer shapes: also timed as punica-bench times a layer's LoRA part
    const std::function<void(cudaStream_t)> calls[] = {sh, ex, both, lin};  // rows' order
    for (int i = 0; i < 4; ++i) {
      const Row& r = rows[i];
      const double s = stream_us(calls[i]);
      std::printf("PERFLAYER T=%-5d none=%d%% S=%d N=%-5lld %-16s floor %8.2f us  cold %8.2f  graph %8.2f  stream %8.2f us (%.0f%% of floor)\n",
                  p.T, p.none_pct, S, (long long)total, r.name, r.floor, r.cold, r.graph, s, 100.0 * r.floor / s);
    }
    PUNICA_CUDA_CHECK(cudaDeviceSynchronize());
    return;
  }
  for (const Row& r : rows)
    std::printf("PERF%s T=%-5d H=%lld r=%-3d L=%-2d act=%-2d S=%d N=%-5lld %-16s floor %8.2f us  cold %8.2f us (%.0f%%)  graph %8.2f us (target %.2f)\n",
                p.blocked ? "[blocked]" : "", p.T, (long long)p.H, R, L, active, S, (long long)total, r.name, r.floor, r.cold,
                100.0 * r.floor / r.cold, r.graph, 2.5 + r.floor / 0.8);
  // One variant timed alone; the last column is the back-to-back target (paths) or the share of
  // the floor (expand kernels).
  auto variant = [&](const char* name, double floor, bool target, const std::function<void(cudaStream_t)>& f) {
    for (int i = 0; i < 3; ++i) f(nullptr);
    PUNICA_CUDA_CHECK(cudaDeviceSynchronize());
    const double cold = cold_us(f, flush), graph = graph_us(f, 20, 7);
    std::printf("PERF%s T=%-5d H=%lld r=%-3d L=%-2d act=%-2d S=%d N=%-5lld %-16s floor %8.2f us  cold %8.2f us (%.0f%%)  graph %8.2f us (%s %.2f)\n",
                p.blocked ? "[blocked]" : "", p.T, (long long)p.H, R, L, active, S, (long long)total, name, floor, cold,
                100.0 * floor / cold, graph, target ? "target" : "share", target ? 2.5 + floor / 0.8 : floor / graph);
  };
  if (p.T <= 128) {
    // Each add_lora_linear path of a decode-sized batch.
    using P = detail::LinearPath;
    const std::pair<P, const char*> ps[] = {{P::decode, "linear[decode]"}, {P::partials, "linear[partials]"},
                                            {P::tiles, "linear[tiles]"}};
    for (const auto& pp : ps)
      variant(pp.second, fl, true, [&](cudaStream_t st) { detail::launch_add_lora_linear_with(la, pp.first, st); });
  } else {
    // Each prefill (mma) expand kernel alone: pipelined, streaming, staged.
    using K = ExpandPrefillKernel;
    const std::pair<K, const char*> ks[] = {{K::mma_pipe, "expand[pipe]"},
                                            {K::mma_stream, "expand[stream]"},
                                            {K::mma_staged, "expand[staged]"}};
    for (const auto& k : ks)
      variant(k.second, fe, false, [&](cudaStream_t st) { launch_lora_expand_with(ea, k.first, st); });
  }
  PUNICA_CUDA_CHECK(cudaDeviceSynchronize());
}

// Programmatic dependent launch: x and y are written by the kernel directly before the op, which
// must wait for it before reading them; and the op twice in a row, the second call's kernels
// launching behind the first's (its y read-modify-write must see the first one's writes). Every
// path: decode, split-K partials, the small-batch chains, prefill (split-K / stream-K behind the
// zero kernel), 3 slices.
TEST(AddLoraLinear, LateInputs) {
  // T=255, one slice of rank <= 16: the mid-batch cluster shrink with late trigger.
  ASSERT_TRUE(linear_heur::mid_cluster(255, 1, 16, 4, 4096));
  for (int T : {1, 16, 64, 255, 2048, 8192})
    for (bool twice : {false, true}) {
      LinearCase c{DType::bf16, T, 4096, {1024}, {16, 8, 0, 16}};
      c.late = !twice;
      c.twice = twice;
      run_case(c);
      LinearCase q{DType::bf16, T, 2048, {1024, 256, 256}, {64, 8, 0, 40}};
      q.late = !twice;
      q.twice = twice;
      run_case(q);
    }
  using P = detail::LinearPath;
  for (P p : {P::decode, P::partials, P::tiles}) {
    LinearCase c{DType::bf16, 16, 4096, {1024}, {16, 8, 0, 16}};
    c.path = p;
    c.late = true;
    run_case(c);
  }
  LinearCase m{DType::bf16, 255, 4096, {1024}, std::vector<int>(32, 64)};
  m.late = true;
  run_case(m);
  // The small-batch cluster chain (linear_heur::small_cluster_pdl_expand): the shrink a programmatic
  // dependent that triggers its dependents only after its wait, the expand loading y before its own
  // wait. 3 slices at rank <= 16 with >= 8 tokens per adapter (T=64, 128), and one slice of rank 64
  // with one adapter (T=32, 40); as everywhere here about 1 / (adapters + 1) of the tokens have none.
  struct Chain {
    int T;
    std::vector<int64_t> slices;
    std::vector<int> ranks;
  };
  const Chain chains[] = {{64, {1024, 256, 256}, {16, 8, 0, 16}},
                          {128, {1024, 256, 256}, {16, 8, 0, 16}},
                          {32, {1024}, {64}},
                          {40, {1024}, {64}}};
  for (const Chain& ch : chains)
    for (bool twice : {false, true}) {
      LinearCase k{DType::bf16, ch.T, 2048, ch.slices, ch.ranks};
      const int rmax = *std::max_element(ch.ranks.begin(), ch.ranks.end());
      ASSERT_TRUE(linear_heur::small_cluster_pdl_expand(ch.T, int(ch.slices.size()), rmax, int(ch.ranks.size())))
          << "T=" << ch.T;
      k.late = !twice;
      k.twice = twice;
      run_case(k);
    }
}

// The Llama-3-8B prefill layer shapes of issue 4 (T=8192, r=16, 8 adapters, 25% of tokens without
// one): qkv at tp 1 and 2, gate_up at tp 2.
TEST(LoraPerf, DISABLED_LayerShapes) {
  perf_shape({8192, 4096, 16, 8, {2048, 512, 512}, false, 25});
  perf_shape({8192, 4096, 16, 8, {4096, 1024, 1024}, false, 25});
  perf_shape({8192, 4096, 16, 8, {7168, 7168}, false, 25});
}

TEST(LoraPerf, DISABLED_Bf16) {
  for (int T : {1, 64, 8192}) perf_shape({T, 4096, 16, 8, {4096}});
  for (int T : {1, 64, 8192}) perf_shape({T, 4096, 16, 8, {4096, 1024, 1024}});
  perf_shape({8192, 4096, 64, 32, {4096, 1024, 1024}});
  perf_shape({64, 4096, 64, 32, {4096, 1024, 1024}});
  perf_shape({8192, 4096, 64, 1, {4096}});
  perf_shape({8192, 4096, 64, 32, {4096}});
  perf_shape({8192, 4096, 16, 8, {4096}, true});
  perf_shape({8192, 4096, 64, 32, {4096, 1024, 1024}, true});
  // decode-sized batches: which add_lora_linear path (bench_lora_ops shapes, 1 / 8 / 32 adapters)
  for (int T : {16, 32, 64, 128})
    for (int L : {1, 8, 32}) {
      perf_shape({T, 4096, 16, L, {4096}});
      perf_shape({T, 8192, 64, L, {8192}});
      perf_shape({T, 4096, 64, L, {4096, 1024, 1024}});
    }
}

}  // namespace
}  // namespace punica::kernels
