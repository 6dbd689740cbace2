// Host helpers of the GPU tests of lora_meta / add_lora_embedding / add_lora_logits /
// apply_lora_full_linear: typed host tensors filled from hash_uniform, device copies with guard
// regions on both sides, the metadata built on the host (punica::ref::lora_meta) and uploaded, and
// the DESIGN §6 comparison (|y - r| <= atol + rtol |r|, atol = rtol * rms(r); bit-equality elsewhere).
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/common/cuda_check.h"
#include "kernels/common/device_buffer.h"
#include "kernels/common/dtype.h"
#include "kernels/common/hash_rng.h"
#include "kernels/common/lora_types.h"
#include "kernels/lora_meta/lora_meta.h"
#include "reference/lora_reference.h"

namespace punica::kernels::testing {

inline float rtol_of(DType t) { return t == DType::bf16 ? 1e-2f : t == DType::f16 ? 5e-3f : 1e-5f; }

// Element storage of one dtype on the host.
struct HostTensor {
  DType dtype = DType::f32;
  std::size_t n = 0;
  std::vector<unsigned char> bytes;
  HostTensor() = default;
  HostTensor(DType t, std::size_t count) : dtype(t), n(count), bytes(count * dtype_size(t)) {}
  void* data() { return bytes.data(); }
  const void* data() const { return bytes.data(); }
  std::size_t nbytes() const { return bytes.size(); }
  float get(std::size_t i) const { return load_elem(bytes.data(), dtype, i); }
  void set(std::size_t i, float v) { store_elem(bytes.data(), dtype, i, v); }
  uint32_t bits(std::size_t i) const {
    uint32_t u = 0;
    std::memcpy(&u, bytes.data() + i * dtype_size(dtype), dtype_size(dtype));
    return u;
  }
  void fill_uniform(uint64_t key, float scale = 1.0f) {
    for (std::size_t i = 0; i < n; ++i) {
      float v = hash_uniform(key, i) * scale;
      if (v == 0.0f) v = 0.5f * scale;  // never zeros
      set(i, v);
    }
  }
  void fill_nan() {
    for (std::size_t i = 0; i < n; ++i) set(i, std::nanf(""));
  }
};

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

inline GuardedBuffer to_device(const HostTensor& h) {
  GuardedBuffer d(h.nbytes());
  d.upload(h.data(), h.nbytes());
  return d;
}
template <class T>
GuardedBuffer to_device(const std::vector<T>& v) {
  GuardedBuffer d(v.size() * sizeof(T));
  d.upload(v.data(), v.size() * sizeof(T));
  return d;
}

// Host-built LoRAKernelMeta (punica::ref::lora_meta) uploaded to the device.
struct HostMeta {
  std::vector<int32_t> mapping, sorted, active, counts, start;
  int32_t no_lora = 0, num_active = 0;
};
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

struct DeviceMeta {
  DeviceBuffer mapping, sorted, active, counts, start, flags;
  LoraMetaView view() const {
    return {mapping.as<int32_t>(), sorted.as<int32_t>(),  active.as<int32_t>(), counts.as<int32_t>(),
            start.as<int32_t>(),   flags.as<int32_t>(),   flags.as<int32_t>() + 1};
  }
};
inline DeviceMeta upload_meta(const HostMeta& m) {
  DeviceMeta d;
  auto up = [](DeviceBuffer& b, const std::vector<int32_t>& v) {
    b = DeviceBuffer(std::max<std::size_t>(1, v.size()) * 4);
    b.upload(v.data(), v.size() * 4);
  };
  up(d.mapping, m.mapping);
  up(d.sorted, m.sorted);
  up(d.active, m.active);
  up(d.counts, m.counts);
  up(d.start, m.start);
  up(d.flags, {m.no_lora, m.num_active});
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
  d.flags = DeviceBuffer(8);
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

// Compare y (device result) with r (reference) over a [rows, stride] buffer: elements with
// `checked(row, col)` by tolerance, every other element bit-equal to y0.
struct CompareResult {
  int64_t nwrong = 0, nchecked = 0, nbitdiff = 0;
  double max_abs = 0, rms = 0;
  std::string first;
};
template <class Pred>
CompareResult compare(const HostTensor& y, const HostTensor& r, const HostTensor& y0, int64_t rows,
                      int64_t stride, Pred checked) {
  CompareResult c;
  const float rtol = rtol_of(y.dtype);
  double ss = 0;
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < stride; ++j)
      if (checked(i, j)) {
        const double v = r.get(std::size_t(i * stride + j));
        ss += v * v;
        ++c.nchecked;
      }
  c.rms = c.nchecked ? std::sqrt(ss / double(c.nchecked)) : 0.0;
  const double atol = rtol * c.rms;
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < stride; ++j) {
      const std::size_t e = std::size_t(i * stride + j);
      if (checked(i, j)) {
        const double a = y.get(e), b = r.get(e);
        const double d = std::fabs(a - b);
        if (!(d <= atol + rtol * std::fabs(b))) {
          if (!c.nwrong)
            c.first = "row " + std::to_string(i) + " col " + std::to_string(j) + ": got " +
                      std::to_string(a) + " want " + std::to_string(b);
          ++c.nwrong;
        }
        if (std::isfinite(d)) c.max_abs = std::max(c.max_abs, d);
      } else if (y.bits(e) != y0.bits(e)) {
        if (!c.nbitdiff)
          c.first += " | untouched element changed at row " + std::to_string(i) + " col " +
                     std::to_string(j);
        ++c.nbitdiff;
      }
    }
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

}  // namespace punica::kernels::testing
