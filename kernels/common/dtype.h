// Element types of the LoRA ops (vLLM's lora_dtype: fp16/bf16, fp32 for the shrink buffer) and
// exact host-side conversions, so the reference and the input generator round exactly as the GPU.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

namespace punica::kernels {

enum class DType : int { f32 = 0, f16 = 1, bf16 = 2 };

inline std::size_t dtype_size(DType t) { return t == DType::f32 ? 4 : 2; }
inline const char* dtype_name(DType t) {
  switch (t) {
    case DType::f32: return "fp32";
    case DType::f16: return "fp16";
    case DType::bf16: return "bf16";
  }
  return "?";
}
// Accepts "fp32|f32|float32", "fp16|f16|float16|half", "bf16|bfloat16".
inline bool parse_dtype(const std::string& s, DType& out) {
  if (s == "fp32" || s == "f32" || s == "float32") { out = DType::f32; return true; }
  if (s == "fp16" || s == "f16" || s == "float16" || s == "half") { out = DType::f16; return true; }
  if (s == "bf16" || s == "bfloat16") { out = DType::bf16; return true; }
  return false;
}

// ---- host conversions (round to nearest even, NaN/Inf preserved) ----
inline uint32_t f32_bits(float f) { uint32_t u; std::memcpy(&u, &f, 4); return u; }
inline float bits_f32(uint32_t u) { float f; std::memcpy(&f, &u, 4); return f; }

inline uint16_t f32_to_bf16_bits(float f) {
  uint32_t u = f32_bits(f);
  if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x007fffffu)) return uint16_t((u >> 16) | 0x0040u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}
inline float bf16_bits_to_f32(uint16_t h) { return bits_f32(uint32_t(h) << 16); }

inline uint16_t f32_to_f16_bits(float f) {
  uint32_t x = f32_bits(f);
  uint32_t sign = (x >> 16) & 0x8000u;
  uint32_t ax = x & 0x7fffffffu;
  if (ax >= 0x7f800000u) return uint16_t(sign | 0x7c00u | (ax > 0x7f800000u ? 0x200u : 0u));
  if (ax >= 0x477ff000u) return uint16_t(sign | 0x7c00u);  // rounds to inf
  if (ax < 0x38800000u) {                                   // subnormal or zero in fp16
    if (ax < 0x33000000u) return uint16_t(sign);            // below half the smallest subnormal
    uint32_t m = (ax & 0x007fffffu) | 0x00800000u;
    int e = int(ax >> 23);
    int shift = 126 - e;  // 113 + 13 - e ... so that result is m >> (shift)
    // value = m * 2^(e-150); fp16 subnormal unit = 2^-24 -> q = m * 2^(e-126)
    uint32_t q = m >> shift;
    uint32_t rem = m & ((1u << shift) - 1u);
    uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (q & 1u))) ++q;
    return uint16_t(sign | q);
  }
  uint32_t r = ax + 0x0fffu + ((ax >> 13) & 1u);
  r -= 0x38000000u;  // rebias 127 -> 15
  return uint16_t(sign | (r >> 13));
}
inline float f16_bits_to_f32(uint16_t h) {
  uint32_t sign = uint32_t(h & 0x8000u) << 16;
  uint32_t e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
  if (e == 0) {
    if (m == 0) return bits_f32(sign);
    float v = float(m) * (1.0f / 16777216.0f);  // m * 2^-24
    return sign ? -v : v;
  }
  if (e == 31) return bits_f32(sign | 0x7f800000u | (m << 13));
  return bits_f32(sign | ((e + 112u) << 23) | (m << 13));
}

// Round a float to the given dtype and back (what a 16-bit store then load does).
inline float round_to(DType t, float v) {
  switch (t) {
    case DType::f16: return f16_bits_to_f32(f32_to_f16_bits(v));
    case DType::bf16: return bf16_bits_to_f32(f32_to_bf16_bits(v));
    default: return v;
  }
}
inline float load_elem(const void* base, DType t, std::size_t i) {
  switch (t) {
    case DType::f16: return f16_bits_to_f32(static_cast<const uint16_t*>(base)[i]);
    case DType::bf16: return bf16_bits_to_f32(static_cast<const uint16_t*>(base)[i]);
    default: return static_cast<const float*>(base)[i];
  }
}
inline void store_elem(void* base, DType t, std::size_t i, float v) {
  switch (t) {
    case DType::f16: static_cast<uint16_t*>(base)[i] = f32_to_f16_bits(v); break;
    case DType::bf16: static_cast<uint16_t*>(base)[i] = f32_to_bf16_bits(v); break;
    default: static_cast<float*>(base)[i] = v; break;
  }
}

}  // namespace punica::kernels
