// Device-side element helpers shared by the embedding/logits/full-linear kernels: fp16/bf16/fp32
// to float and back with round-to-nearest-even (matching kernels/common/dtype.h on the host), and
// 16-byte vector loads unpacked to float, so every op accumulates in fp32 from 16-bit storage.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cstdint>

#include "kernels/common/dtype.h"

namespace punica::kernels::elem {

__device__ __forceinline__ float to_f(float v) { return v; }
__device__ __forceinline__ float to_f(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_f(__nv_bfloat16 v) { return __bfloat162float(v); }

template <class T> __device__ __forceinline__ T from_f(float v);
template <> __device__ __forceinline__ float from_f<float>(float v) { return v; }
template <> __device__ __forceinline__ __half from_f<__half>(float v) { return __float2half_rn(v); }
template <> __device__ __forceinline__ __nv_bfloat16 from_f<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}

// What a store to T followed by a load does (identity for fp32).
template <class T> __device__ __forceinline__ float round_w(float v) { return to_f(from_f<T>(v)); }

// Elements of T in one 16-byte vector.
template <class T> constexpr int kVecElems = int(16 / sizeof(T));

__device__ __forceinline__ void unpack(const uint4& u, float (&f)[4]) {
  f[0] = __uint_as_float(u.x); f[1] = __uint_as_float(u.y);
  f[2] = __uint_as_float(u.z); f[3] = __uint_as_float(u.w);
}
__device__ __forceinline__ void unpack2(uint32_t w, float& a, float& b, __half) {
  const float2 v = __half22float2(*reinterpret_cast<const __half2*>(&w));
  a = v.x; b = v.y;
}
__device__ __forceinline__ void unpack2(uint32_t w, float& a, float& b, __nv_bfloat16) {
  // bf16 -> fp32 is exact: the bits move to the top half.
  a = __uint_as_float(w << 16);
  b = __uint_as_float(w & 0xffff0000u);
}
template <class T>
__device__ __forceinline__ void unpack(const uint4& u, float (&f)[8]) {
  unpack2(u.x, f[0], f[1], T{}); unpack2(u.y, f[2], f[3], T{});
  unpack2(u.z, f[4], f[5], T{}); unpack2(u.w, f[6], f[7], T{});
}

// Read-only 16-byte load (p must be 16-byte aligned), unpacked to float.
template <class T>
__device__ __forceinline__ void load_vec(const T* p, float (&f)[kVecElems<T>]) {
  const uint4 u = __ldg(reinterpret_cast<const uint4*>(p));
  if constexpr (sizeof(T) == 4) unpack(u, f);
  else unpack<T>(u, f);
}

template <class T> __device__ __forceinline__ float load_ro(const T* p) { return to_f(__ldg(p)); }

// Map the runtime dtype onto the storage type and call f(T{}).
template <class F> void dispatch_dtype(DType t, F&& f) {
  switch (t) {
    case DType::f32: f(float{}); break;
    case DType::f16: f(__half{}); break;
    case DType::bf16: f(__nv_bfloat16{}); break;
  }
}

}  // namespace punica::kernels::elem
