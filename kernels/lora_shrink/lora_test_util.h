// Host helpers shared by the lora_shrink / lora_expand / add_lora_linear GPU tests: random 16/32-bit
// tensors from hash_uniform, vLLM LoRAKernelMeta computed on the host (SPEC §2.5) and uploaded,
// guarded device outputs, and the |y - r| <= atol + rtol |r| comparison (atol = rtol * rms(r)).
#pragma once
#include <gtest/gtest.h>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <numeric>
#include <string>
#include <vector>
#include "kernels/common/cuda_check.h"
#include "kernels/common/device_buffer.h"
#include "kernels/common/dtype.h"
#include "kernels/common/hash_rng.h"
#include "kernels/common/lora_types.h"

namespace punica::kernels::testutil {

// A host tensor stored as raw bytes in its dtype.
struct HostTensor {
  DType dtype = DType::f32;
  std::size_t n = 0;
  std::vector<uint8_t> bytes;
  HostTensor() = default;
  HostTensor(DType t, std::size_t count) : dtype(t), n(count), bytes(count * dtype_size(t)) {}
  void* data() { return bytes.data(); }
  const void* data() const { return bytes.data(); }
  float get(std::size_t i) const { return load_elem(bytes.data(), dtype, i); }
  void set(std::size_t i, float v) { store_elem(bytes.data(), dtype, i, v); }
  uint32_t bits(std::size_t i) const {
    if (dtype == DType::f32) { uint32_t u; std::memcpy(&u, bytes.data() + 4 * i, 4); return u; }
    uint16_t u; std::memcpy(&u, bytes.data() + 2 * i, 2); return u;
  }
};

inline HostTensor random_tensor(DType t, std::size_t n, uint64_t key, float amp = 1.f) {
  HostTensor h(t, n);
  for (std::size_t i = 0; i < n; ++i) h.set(i, amp * hash_uniform(key, i));
  return h;
}

// LoRAKernelMeta.prepare_tensors on the host.
struct HostMeta {
  std::vector<int32_t> mapping, sorted, active, counts, start;
  int32_t no_lora = 0, num_active = 0;
};
inline HostMeta build_meta(const std::vector<int32_t>& map, int L) {
  HostMeta m;
  const int T = int(map.size());
  m.mapping = map;
  m.sorted.resize(std::size_t(std::max(T, 1)), 0);
  m.active.assign(std::size_t(L + 1), -1);
  m.counts.assign(std::size_t(L + 1), 0);
  m.start.assign(std::size_t(L + 2), 0);
  m.no_lora = std::all_of(map.begin(), map.end(), [](int32_t v) { return v < 0; }) ? 1 : 0;
  std::vector<int32_t> order(static_cast<std::size_t>(T));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return map[a] < map[b]; });
  for (int i = 0; i < T; ++i) m.sorted[std::size_t(i)] = order[std::size_t(i)];
  int na = 0;
  for (int i = 0; i < T; ++i) {
    const int32_t v = map[std::size_t(order[std::size_t(i)])];
    if (na == 0 || m.active[std::size_t(na - 1)] != v) { m.active[std::size_t(na)] = v; ++na; }
    m.counts[std::size_t(na - 1)]++;
  }
  m.num_active = na;
  for (int i = 0; i < na; ++i) m.start[std::size_t(i + 1)] = m.start[std::size_t(i)] + m.counts[std::size_t(i)];
  return m;
}

struct DeviceMeta {
  DeviceBuffer mapping, sorted, active, counts, start, no_lora, num_active;
  LoraMetaView view() const {
    return {mapping.as<int32_t>(), sorted.as<int32_t>(), active.as<int32_t>(), counts.as<int32_t>(),
            start.as<int32_t>(), no_lora.as<int32_t>(), num_active.as<int32_t>()};
  }
};
inline void upload_vec(DeviceBuffer& b, const std::vector<int32_t>& v) {
  b = DeviceBuffer(std::max<std::size_t>(v.size(), 1) * 4);
  if (!v.empty()) b.upload(v.data(), v.size() * 4);
}
inline void upload_meta(DeviceMeta& d, const HostMeta& m) {
  upload_vec(d.mapping, m.mapping.empty() ? std::vector<int32_t>{-1} : m.mapping);
  upload_vec(d.sorted, m.sorted);
  upload_vec(d.active, m.active);
  upload_vec(d.counts, m.counts);
  upload_vec(d.start, m.start);
  upload_vec(d.no_lora, {m.no_lora});
  upload_vec(d.num_active, {m.num_active});
}

// Mapping over slots whose rank > 0 plus -1, pseudo-random.
inline std::vector<int32_t> make_mapping(int T, const std::vector<int>& ranks, uint64_t key, bool with_none = true) {
  std::vector<int32_t> usable;
  for (int l = 0; l < int(ranks.size()); ++l)
    if (ranks[std::size_t(l)] > 0) usable.push_back(l);
  std::vector<int32_t> map(static_cast<std::size_t>(T));
  const uint64_t choices = usable.size() + (with_none ? 1 : 0);
  for (int t = 0; t < T; ++t) {
    const uint64_t c = hash_below(key, uint64_t(t), choices);
    map[std::size_t(t)] = c < usable.size() ? usable[std::size_t(c)] : -1;
  }
  return map;
}

// Few adapters in many slots (bench_sparse_slots' regime): 32 slots, only slots 5 (rank 64) and
// 29 (rank 16) loaded, or only slot 17 (rank 64) with one = true.
inline std::vector<int> sparse_ranks(bool one = false) {
  std::vector<int> r(32, 0);
  if (one) { r[17] = 64; return r; }
  r[5] = 64;
  r[29] = 16;
  return r;
}
// The ActiveLorasHint grid of the shrink, expand and add_lora_linear tests: one or two adapters in
// 32 slots (sparse_ranks) with the exact hint, T = 1 .. 8192, one slice of 4096 or the qkv slices
// 4096 / 1024 / 1024. f(T, widths, ranks, hint) runs one case.
template <class F>
void for_each_sparse_hint_case(F&& f) {
  for (bool one : {false, true})
    for (int T : {1, 16, 64, 200, 2048, 8192})
      for (int S : {1, 3})
        f(T, S == 1 ? std::vector<int64_t>{4096} : std::vector<int64_t>{4096, 1024, 1024}, sparse_ranks(one),
          one ? 1 : 2);
}
// The same grid for a test whose case struct has the fields T, widths, ranks, nan_pad and hint
// (ExpandCase, LinearCase): each case with NaN padding, through run.
template <class Case, class Run>
void run_sparse_hint_cases(Run&& run) {
  for_each_sparse_hint_case([&](int T, const std::vector<int64_t>& widths, const std::vector<int>& ranks, int hint) {
    Case c;
    c.T = T;
    c.widths = widths;
    c.ranks = ranks;
    c.nan_pad = true;
    c.hint = hint;
    run(c);
  });
}

// Device copy with guard regions before and after (kGuard elements each, a canary pattern).
constexpr std::size_t kGuard = 64;
// 40 slots for the decode tests: mixed true ranks (1, 8, 16, 33, 64) and empty (rank 0) slots.
inline std::vector<int> many_ranks() {
  const int pat[6] = {16, 64, 8, 0, 33, 1};
  std::vector<int> r;
  for (int i = 0; i < 40; ++i) r.push_back(pat[i % 6]);
  return r;
}

inline uint32_t canary(DType t) { return t == DType::f32 ? 0x7fc0beefu : 0x7e5au; }
struct Guarded {
  DeviceBuffer buf;
  DType dtype;
  std::size_t n;
  Guarded(const HostTensor& h) : buf((h.n + 2 * kGuard) * dtype_size(h.dtype)), dtype(h.dtype), n(h.n) {
    device_fill_pattern(buf.get(), h.n + 2 * kGuard, int(dtype_size(dtype)), canary(dtype), nullptr);
    PUNICA_CUDA_CHECK(cudaDeviceSynchronize());
    if (h.n) buf.upload(h.data(), h.bytes.size(), kGuard * dtype_size(dtype));
  }
  void* ptr() const { return static_cast<uint8_t*>(buf.get()) + kGuard * dtype_size(dtype); }
  // Downloads the payload; returns false (and reports) if a guard changed.
  HostTensor download(bool& guards_ok) const {
    HostTensor all(dtype, n + 2 * kGuard);
    buf.download(all.data(), all.bytes.size());
    guards_ok = true;
    for (std::size_t i = 0; i < kGuard; ++i)
      if (all.bits(i) != canary(dtype) || all.bits(n + kGuard + i) != canary(dtype)) guards_ok = false;
    HostTensor out(dtype, n);
    std::memcpy(out.data(), all.bytes.data() + kGuard * dtype_size(dtype), out.bytes.size());
    return out;
  }
};

inline DeviceBuffer to_device(const HostTensor& h) {
  DeviceBuffer b(std::max<std::size_t>(h.bytes.size(), 16));
  if (h.n) b.upload(h.data(), h.bytes.size());
  return b;
}

inline float rtol_for(DType t) { return t == DType::bf16 ? 1e-2f : t == DType::f16 ? 5e-3f : 1e-5f; }

// Compares got with ref over the elements where check[i] (all when empty). Returns #wrong.
inline std::size_t compare(const HostTensor& got, const HostTensor& ref, float rtol,
                           const std::vector<uint8_t>& check, std::string& report) {
  double ss = 0;
  std::size_t cnt = 0;
  for (std::size_t i = 0; i < ref.n; ++i)
    if (check.empty() || check[i]) { const double r = ref.get(i); ss += r * r; ++cnt; }
  const double rms = cnt ? std::sqrt(ss / double(cnt)) : 0.0;
  const double atol = rtol * rms;
  std::size_t wrong = 0;
  double max_abs = 0;
  for (std::size_t i = 0; i < ref.n; ++i) {
    if (!check.empty() && !check[i]) continue;
    const double g = got.get(i), r = ref.get(i);
    const double d = std::fabs(g - r);
    if (!(d <= atol + rtol * std::fabs(r))) {
      if (wrong < 5) report += " [" + std::to_string(i) + "] got " + std::to_string(g) + " ref " + std::to_string(r) + ";";
      ++wrong;
    }
    if (d > max_abs || std::isnan(d)) max_abs = d;
  }
  report += " max_abs=" + std::to_string(max_abs) + " rms=" + std::to_string(rms);
  return wrong;
}

// ---- timing (the DISABLED_ perf tests print it, nothing asserts it; run them by hand with
// --gtest_also_run_disabled_tests): the median of
// cold single launches (a memset of `flush` evicts L2 before each), and the per-call time of
// `calls` launches captured in one CUDA graph (median of reps - 2 replays after 2 warm-ups).
struct EventPair {
  cudaEvent_t a, b;
  EventPair() { PUNICA_CUDA_CHECK(cudaEventCreate(&a)); PUNICA_CUDA_CHECK(cudaEventCreate(&b)); }
  ~EventPair() { cudaEventDestroy(a); cudaEventDestroy(b); }
  float elapsed_us() const {
    float ms = 0;
    PUNICA_CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
    return ms * 1000.f;
  }
};
inline double median_of(std::vector<float> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}
template <class F>
double cold_us(F&& f, DeviceBuffer& flush, int iters = 15) {
  EventPair ev;
  std::vector<float> v;
  for (int i = 0; i < iters + 2; ++i) {
    PUNICA_CUDA_CHECK(cudaMemsetAsync(flush.get(), i & 0xff, flush.bytes(), nullptr));
    PUNICA_CUDA_CHECK(cudaEventRecord(ev.a, nullptr));
    f(cudaStream_t(nullptr));
    PUNICA_CUDA_CHECK(cudaEventRecord(ev.b, nullptr));
    PUNICA_CUDA_CHECK(cudaEventSynchronize(ev.b));
    if (i >= 2) v.push_back(ev.elapsed_us());
  }
  return median_of(v);
}
template <class F>
double graph_us(F&& f, int calls, int reps) {
  cudaStream_t st;
  PUNICA_CUDA_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  cudaGraph_t g;
  PUNICA_CUDA_CHECK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
  for (int i = 0; i < calls; ++i) f(st);
  PUNICA_CUDA_CHECK(cudaStreamEndCapture(st, &g));
  cudaGraphExec_t ge;
  PUNICA_CUDA_CHECK(cudaGraphInstantiate(&ge, g, 0));
  EventPair ev;
  std::vector<float> v;
  for (int i = 0; i < reps; ++i) {
    PUNICA_CUDA_CHECK(cudaEventRecord(ev.a, st));
    PUNICA_CUDA_CHECK(cudaGraphLaunch(ge, st));
    PUNICA_CUDA_CHECK(cudaEventRecord(ev.b, st));
    PUNICA_CUDA_CHECK(cudaEventSynchronize(ev.b));
    if (i >= 2) v.push_back(ev.elapsed_us() / calls);
  }
  cudaGraphExecDestroy(ge);
  cudaGraphDestroy(g);
  cudaStreamDestroy(st);
  return median_of(v);
}

// The batch of the perf tests: token t -> adapter hash(t) mod L, none_pct% of the tokens without
// adapter, every adapter of rank R; metadata and ranks on the device.
struct PerfBatch {
  std::vector<int32_t> map;
  HostMeta hm;
  DeviceMeta dm;
  DeviceBuffer ranks;
  int64_t with_lora = 0;  // tokens with an adapter
  PerfBatch(int T, int L, int R, int none_pct) : map(static_cast<std::size_t>(T)) {
    for (int t = 0; t < T; ++t)
      map[std::size_t(t)] = int(hash_below(78, uint64_t(t), 100)) < none_pct
                                ? -1
                                : int32_t(hash_below(77, uint64_t(t), uint64_t(L)));
    hm = build_meta(map, L);
    upload_meta(dm, hm);
    const std::vector<int32_t> r(std::size_t(L), R);
    ranks = DeviceBuffer(r.size() * 4);
    ranks.upload(r.data(), r.size() * 4);
    for (int32_t m : map) with_lora += m >= 0;
  }
};

// Back to back on one stream, no flush and no host wait between calls, each call between its own
// pair of events: how punica-bench times a layer's parts (Backend::time_iterations). Median per call.
template <class F>
double stream_us(F&& f, int iters = 20) {
  std::vector<EventPair> ev(static_cast<std::size_t>(iters));
  for (int i = 0; i < 3; ++i) f(cudaStream_t(nullptr));
  for (auto& e : ev) {
    PUNICA_CUDA_CHECK(cudaEventRecord(e.a, nullptr));
    f(cudaStream_t(nullptr));
    PUNICA_CUDA_CHECK(cudaEventRecord(e.b, nullptr));
  }
  PUNICA_CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<float> v;
  for (auto& e : ev) v.push_back(e.elapsed_us());
  return median_of(v);
}

// One perf line: warm-up, then the cold (flushed) and back-to-back (graph) median times of f,
// printed after `prefix` with the share of the floor each reaches.
template <class F>
void perf_line(const std::string& prefix, const char* label, double floor_us, F&& f, DeviceBuffer& flush,
               int calls = 50, int reps = 9) {
  for (int i = 0; i < 3; ++i) f(cudaStream_t(nullptr));
  PUNICA_CUDA_CHECK(cudaDeviceSynchronize());
  const double cold = cold_us(f, flush), graph = graph_us(f, calls, reps);
  std::printf("%s %-14s floor %7.2f us  cold %8.2f us (%3.0f%%)  graph %8.2f us (%3.0f%%)\n", prefix.c_str(), label,
              floor_us, cold, 100.0 * floor_us / cold, graph, 100.0 * floor_us / graph);
}

// Programmatic-dependent-launch ordering (the LateInputs tests). late_copy waits spin_us on the
// device clock and only then copies each (src -> dst) pair; launched on `st` directly before the
// op under test, with dst holding other values until then. An op whose kernels read x or y before
// their griddepcontrol.wait (or that start before the kernel that wrote x is done) computes with
// the old values, and the comparison with the reference fails.
struct LateCopy {
  const void* src;
  void* dst;
  std::size_t bytes;
};
static __global__ void late_copy_kernel(LateCopy a, LateCopy b, unsigned long long spin_ns) {
  unsigned long long t0 = 0, t = 0;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  do {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  } while (t - t0 < spin_ns);
  const std::size_t i0 = std::size_t(blockIdx.x) * blockDim.x + threadIdx.x, step = std::size_t(gridDim.x) * blockDim.x;
  for (std::size_t i = i0; i < a.bytes; i += step) static_cast<uint8_t*>(a.dst)[i] = static_cast<const uint8_t*>(a.src)[i];
  for (std::size_t i = i0; i < b.bytes; i += step) static_cast<uint8_t*>(b.dst)[i] = static_cast<const uint8_t*>(b.src)[i];
}
// What an input's device copy holds before late_copy runs: `real` itself, or (late) other random
// values under `key`, made in `other`. No copy of `real` either way.
inline const HostTensor& before_late(const HostTensor& real, bool late, uint64_t key, HostTensor& other) {
  if (!late) return real;
  other = random_tensor(real.dtype, real.n, key);
  return other;
}
inline void late_copy(LateCopy a, LateCopy b, cudaStream_t st, double spin_us = 200.0) {
  late_copy_kernel<<<264, 256, 0, st>>>(a, b, static_cast<unsigned long long>(spin_us * 1e3));
  PUNICA_CUDA_CHECK_LAUNCH();
}

// A non-blocking stream for one test case (the ops' programmatic launches as vLLM makes them).
struct TestStream {
  cudaStream_t s = nullptr;
  TestStream() { PUNICA_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking)); }
  ~TestStream() { cudaStreamDestroy(s); }
  TestStream(const TestStream&) = delete;
  TestStream& operator=(const TestStream&) = delete;
};

}  // namespace punica::kernels::testutil
