// The host tensor of the tests (GPU tests and the reference tests): elements of one dtype stored as
// raw bytes, read and written as double (16-bit values round to nearest even on set), with the NaN
// poison of write-only outputs. Plain C++ (no CUDA).
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>
#include "kernels/common/dtype.h"
#include "kernels/common/hash_rng.h"

namespace punica::kernels {

// The quiet-NaN bit pattern of dtype t (what NaN poisoning and NaN padding write).
inline uint32_t nan_bits(DType t) { return t == DType::f32 ? 0x7fc00000u : t == DType::f16 ? 0x7e00u : 0x7fc0u; }

struct HostTensor {
  DType dtype = DType::f32;
  std::size_t n = 0;                // elements
  std::vector<int64_t> shape;       // {n} unless given
  std::vector<uint8_t> bytes;       // n * dtype_size(dtype), zero-initialised (+0.0)

  HostTensor() = default;
  HostTensor(DType t, std::size_t count, double fill = 0.0)
      : dtype(t), n(count), shape{int64_t(count)}, bytes(count * dtype_size(t)) {
    if (fill != 0.0)
      for (std::size_t i = 0; i < n; ++i) set(i, fill);
  }
  HostTensor(DType t, std::vector<int64_t> dims) : HostTensor(t, numel_of(dims)) { shape = std::move(dims); }
  static std::size_t numel_of(const std::vector<int64_t>& dims) {
    std::size_t k = 1;
    for (int64_t d : dims) k *= std::size_t(d > 0 ? d : 0);
    return k;
  }

  std::size_t size() const { return n; }
  std::size_t nbytes() const { return bytes.size(); }
  void* data() { return bytes.data(); }
  const void* data() const { return bytes.data(); }
  double get(std::size_t i) const { return load_elem(bytes.data(), dtype, i); }
  void set(std::size_t i, double v) { store_elem(bytes.data(), dtype, i, float(v)); }
  // The element's bits (16-bit dtypes in the low half).
  uint32_t bits(std::size_t i) const {
    uint32_t u = 0;
    std::memcpy(&u, bytes.data() + i * dtype_size(dtype), dtype_size(dtype));
    return u;
  }
  void set_bits(std::size_t i, uint32_t u) { std::memcpy(bytes.data() + i * dtype_size(dtype), &u, dtype_size(dtype)); }
  // scale * hash_uniform(key, i), never exactly 0 (0.5 * scale instead).
  void fill_uniform(uint64_t key, float scale = 1.0f) {
    for (std::size_t i = 0; i < n; ++i) {
      float v = hash_uniform(key, i) * scale;
      if (v == 0.0f) v = 0.5f * scale;
      set(i, v);
    }
  }
  // Every element the quiet NaN (the poison of write-only outputs).
  void fill_nan() {
    for (std::size_t i = 0; i < n; ++i) set_bits(i, nan_bits(dtype));
  }
};

}  // namespace punica::kernels
