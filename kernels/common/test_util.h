// Host helpers of every GPU test: host tensors (kernels/common/host_tensor.h) filled from
// hash_uniform, vLLM LoRAKernelMeta computed on the host (SPEC §2.5, or punica::ref::lora_meta) or by
// launch_lora_meta and uploaded, device copies with guard regions, the DESIGN §6 comparison
// (kernels/common/check.h), and the timing of the DISABLED_ perf tests.
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
#include "kernels/common/check.h"
#include "kernels/common/cuda_check.h"
#include "kernels/common/device_buffer.h"
#include "kernels/common/dtype.h"
#include "kernels/common/hash_rng.h"
#include "kernels/common/host_tensor.h"
#include "kernels/common/lora_types.h"
#include "kernels/lora_meta/lora_meta.h"
#include "reference/lora_reference.h"

namespace punica::kernels::testutil {


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

// Compares got with ref (DESIGN §6, kernels/common/check.h) over the elements where check[i] (all
// when empty). y0: the initial contents of an accumulating output (the 1-ulp slack of its rounded
// delta), nullptr for a write-only one. Returns the wrong count and appends to report.
inline std::size_t compare(const HostTensor& got, const HostTensor& ref, double rtol, const std::vector<uint8_t>& check,
                           std::string& report, const HostTensor* y0 = nullptr) {
  CheckSpec spec;
  spec.dtype = ref.dtype;
  spec.n = ref.n;
  spec.y0 = y0 ? y0->data() : nullptr;
  if (!check.empty()) spec.compared = [&](std::size_t i) { return check[i] != 0; };
  const CheckResult r = check_close(got.data(), ref.data(), rtol, spec);
  for (const std::string& m : r.first_mismatches) report += " " + m + ";";
  report += " max_abs=" + std::to_string(r.max_abs_err) + " rms=" + std::to_string(r.rms);
  return r.nwrong;
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


// ---- the helpers of the lora_meta / embedding / logits / full_linear tests
// A device copy with kGuard elements of a canary before and after; the payload starts 256-byte
// aligned (so the 16-byte paths run; odd row lengths give the misaligned cases).
class GuardedBuffer {
 public:
  static constexpr std::size_t kGuardBytes = 1024;
  GuardedBuffer() = default;
  explicit GuardedBuffer(std::size_t payload_bytes)
      : payload_(payload_bytes), buf_(payload_bytes + 2 * kGuardBytes) {
    std::vector<unsigned char> init(buf_.bytes());
    for (std::size_t i = 0; i < init.size(); ++i) init[i] = canary(i);
    buf_.upload(init.data(), init.size());
  }
  void* data() const { return static_cast<char*>(buf_.get()) + kGuardBytes; }
  template <class T> T* as() const { return static_cast<T*>(data()); }
  void upload(const void* host, std::size_t bytes) { buf_.upload(host, bytes, kGuardBytes); }
  void download(void* host, std::size_t bytes) const { buf_.download(host, bytes, kGuardBytes); }
  // Guards unchanged?
  bool guards_ok() const {
    std::vector<unsigned char> all(buf_.bytes());
    buf_.download(all.data(), all.size());
    for (std::size_t i = 0; i < kGuardBytes; ++i)
      if (all[i] != canary(i)) return false;
    for (std::size_t i = kGuardBytes + payload_; i < all.size(); ++i)
      if (all[i] != canary(i)) return false;
    return true;
  }

 private:
  static unsigned char canary(std::size_t i) { return static_cast<unsigned char>(0xA5u ^ (i * 31u)); }
  std::size_t payload_ = 0;
  DeviceBuffer buf_;
};

inline GuardedBuffer to_guarded(const HostTensor& h) {
  GuardedBuffer d(h.nbytes());
  d.upload(h.data(), h.nbytes());
  return d;
}
template <class T>
GuardedBuffer to_guarded(const std::vector<T>& v) {
  GuardedBuffer d(v.size() * sizeof(T));
  d.upload(v.data(), v.size() * sizeof(T));
  return d;
}

// Host-built LoRAKernelMeta (punica::ref::lora_meta).
inline HostMeta host_meta(const std::vector<int32_t>& mapping, int L) {
  HostMeta m;
  const std::size_t T = mapping.size();
  m.mapping.assign(T, 0);
  m.sorted.assign(T, 0);
  m.active.assign(std::size_t(L) + 1, 0);
  m.counts.assign(std::size_t(L) + 1, 0);
  m.start.assign(std::size_t(L) + 2, 0);
  LoraMetaArgs a;
  a.num_tokens = int64_t(T);
  a.max_loras = L;
  a.token_lora_mapping_in = mapping.data();
  a.token_lora_mapping = m.mapping.data();
  a.sorted_token_ids = m.sorted.data();
  a.active_lora_ids = m.active.data();
  a.num_tokens_per_lora = m.counts.data();
  a.lora_token_start_loc = m.start.data();
  a.no_lora_flag = &m.no_lora;
  a.num_active = &m.num_active;
  punica::ref::lora_meta(a);
  return m;
}

inline DeviceMeta upload_meta(const HostMeta& m) {
  DeviceMeta d;
  upload_meta(d, m);
  return d;
}
// Device metadata built by launch_lora_meta (the path a real batch takes).
inline DeviceMeta gpu_meta(const std::vector<int32_t>& mapping, int L) {
  DeviceMeta d;
  const std::size_t T = mapping.size();
  DeviceBuffer in(std::max<std::size_t>(1, T) * 4);
  in.upload(mapping.data(), T * 4);
  d.mapping = DeviceBuffer(std::max<std::size_t>(1, T) * 4);
  d.sorted = DeviceBuffer(std::max<std::size_t>(1, T) * 4);
  d.active = DeviceBuffer((std::size_t(L) + 1) * 4);
  d.counts = DeviceBuffer((std::size_t(L) + 1) * 4);
  d.start = DeviceBuffer((std::size_t(L) + 2) * 4);
  d.no_lora = DeviceBuffer(4);
  d.num_active = DeviceBuffer(4);
  DeviceBuffer ws(lora_meta_workspace_bytes(int64_t(T), L));
  LoraMetaArgs a;
  a.num_tokens = int64_t(T);
  a.max_loras = L;
  a.token_lora_mapping_in = in.as<int32_t>();
  const LoraMetaView v = d.view();
  a.token_lora_mapping = const_cast<int32_t*>(v.token_lora_mapping);
  a.sorted_token_ids = const_cast<int32_t*>(v.sorted_token_ids);
  a.active_lora_ids = const_cast<int32_t*>(v.active_lora_ids);
  a.num_tokens_per_lora = const_cast<int32_t*>(v.num_tokens_per_lora);
  a.lora_token_start_loc = const_cast<int32_t*>(v.lora_token_start_loc);
  a.no_lora_flag = const_cast<int32_t*>(v.no_lora_flag);
  a.num_active = const_cast<int32_t*>(v.num_active);
  a.workspace = ws.get();
  a.workspace_bytes = ws.bytes();
  launch_lora_meta(a, nullptr);
  PUNICA_CUDA_CHECK(cudaDeviceSynchronize());
  return d;
}

// Mapping of T tokens over `slots` (the used slot values, -1 allowed), hash-random.
inline std::vector<int32_t> random_mapping(uint64_t key, int64_t T, const std::vector<int32_t>& slots) {
  std::vector<int32_t> m(std::size_t(std::max<int64_t>(0, T)));
  for (std::size_t t = 0; t < m.size(); ++t) m[t] = slots[hash_below(key, t, slots.size())];
  return m;
}

// Compare y (device result) with r (reference) over a [rows, stride] buffer (DESIGN §6,
// kernels/common/check.h): elements with `checked(row, col)` by tolerance, every other element
// bit-equal to y0.
struct CompareResult {
  int64_t nwrong = 0, nchecked = 0, nbitdiff = 0;
  double max_abs = 0, rms = 0;
  std::string first;
};
template <class Pred>
CompareResult compare(const HostTensor& y, const HostTensor& r, const HostTensor& y0, int64_t rows,
                      int64_t stride, Pred checked) {
  CompareResult c;
  CheckSpec spec;
  spec.dtype = y.dtype;
  spec.n = std::size_t(rows * stride);
  spec.y0 = y0.data();
  spec.keep = [&](std::size_t e) { return !checked(int64_t(e) / stride, int64_t(e) % stride); };
  spec.rows = rows;
  spec.inner = stride;
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < stride; ++j) c.nchecked += checked(i, j) ? 1 : 0;
  const CheckResult k = check_close(y.data(), r.data(), rtol_for(y.dtype), spec);
  c.nwrong = int64_t(k.nwrong - k.nuntouched);
  c.nbitdiff = int64_t(k.nuntouched);
  c.max_abs = k.max_abs_err;
  c.rms = k.rms;
  for (const std::string& m : k.first_mismatches) c.first += (c.first.empty() ? "" : " | ") + m;
  return c;
}
// Median-free quick timing (mean over `iters` after 3 warm-ups) of f() on the legacy stream, in
// microseconds; for the DISABLED_Timing tests only (the real timing lives in punica-bench).
template <class F>
double time_us(F&& f, int iters = 50) {
  for (int i = 0; i < 3; ++i) f();
  cudaEvent_t e0, e1;
  PUNICA_CUDA_CHECK(cudaEventCreate(&e0));
  PUNICA_CUDA_CHECK(cudaEventCreate(&e1));
  PUNICA_CUDA_CHECK(cudaEventRecord(e0, nullptr));
  for (int i = 0; i < iters; ++i) f();
  PUNICA_CUDA_CHECK(cudaEventRecord(e1, nullptr));
  PUNICA_CUDA_CHECK(cudaEventSynchronize(e1));
  float ms = 0;
  PUNICA_CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  return 1000.0 * ms / iters;
}


}  // namespace punica::kernels::testutil

// The lora_meta-family tests live in punica::kernels::testing.
namespace punica::kernels::testing {
using namespace testutil;
}  // namespace punica::kernels::testing
