// Host fp16/bf16 conversions of kernels/common/dtype.h: known bit patterns, rounding to nearest
// even, subnormals, overflow, NaN/Inf, exhaustive 16-bit round trips, and random fp32 inputs
// against independent rounding (the compiler's _Float16 where available, exact double math for bf16).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "kernels/common/dtype.h"
#include "kernels/common/hash_rng.h"

using namespace punica::kernels;

namespace {

float f(uint32_t bits) { return bits_f32(bits); }

// Independent bf16 rounding: the two bf16 neighbours of v (truncation and the next one up in
// magnitude), pick the nearer in exact double arithmetic, ties to the even mantissa.
uint16_t bf16_oracle(float v) {
  uint32_t u = f32_bits(v);
  if (std::isnan(v)) return uint16_t((u >> 16) | 0x40u);
  uint16_t lo = uint16_t(u >> 16);
  if ((u & 0xffffu) == 0) return lo;
  uint16_t hi = uint16_t(lo + 1);  // next magnitude (may become Inf: 0x7f80 pattern is fine)
  double dv = std::fabs(double(v));
  double dlo = std::fabs(double(bf16_bits_to_f32(lo)));
  // value of hi without relying on Inf: lo magnitude + one bf16 ulp of lo's binade
  int e = int((lo >> 7) & 0xff);
  double ulp = std::ldexp(1.0, (e == 0 ? 1 : e) - 127 - 7);
  double dhi = dlo + ulp;
  if (dv - dlo < dhi - dv) return lo;
  if (dv - dlo > dhi - dv) return hi;
  return (lo & 1u) ? hi : lo;
}

}  // namespace

TEST(DtypeF16, KnownValues) {
  EXPECT_EQ(f32_to_f16_bits(1.0f), 0x3C00);
  EXPECT_EQ(f32_to_f16_bits(-2.0f), 0xC000);
  EXPECT_EQ(f32_to_f16_bits(0.0f), 0x0000);
  EXPECT_EQ(f32_to_f16_bits(-0.0f), 0x8000);
  EXPECT_EQ(f32_to_f16_bits(65504.0f), 0x7BFF);            // max finite
  EXPECT_EQ(f32_to_f16_bits(65519.99f), 0x7BFF);           // below the halfway point
  EXPECT_EQ(f32_to_f16_bits(65520.0f), 0x7C00);            // tie -> even = Inf
  EXPECT_EQ(f32_to_f16_bits(1e6f), 0x7C00);
  EXPECT_EQ(f32_to_f16_bits(-1e6f), 0xFC00);
  EXPECT_EQ(f32_to_f16_bits(std::ldexp(1.0f, -14)), 0x0400);  // min normal
  EXPECT_EQ(f32_to_f16_bits(std::ldexp(1.0f, -24)), 0x0001);  // min subnormal
  EXPECT_EQ(f32_to_f16_bits(std::ldexp(1.0f, -25)), 0x0000);  // tie -> even 0
  EXPECT_EQ(f32_to_f16_bits(std::ldexp(1.0f, -25) * 1.0001f), 0x0001);
  EXPECT_EQ(f32_to_f16_bits(std::ldexp(3.0f, -25)), 0x0002);  // 1.5 units -> 2 (even)
  EXPECT_EQ(f32_to_f16_bits(std::ldexp(5.0f, -25)), 0x0002);  // 2.5 units -> 2 (even)
  EXPECT_EQ(f32_to_f16_bits(std::ldexp(1023.0f, -24)), 0x03FF);  // max subnormal
  EXPECT_EQ(f32_to_f16_bits(1.0f + std::ldexp(1.0f, -11)), 0x3C00);       // tie -> even
  EXPECT_EQ(f32_to_f16_bits(1.0f + std::ldexp(3.0f, -11)), 0x3C02);       // tie -> even (up)
  EXPECT_EQ(f32_to_f16_bits(std::numeric_limits<float>::infinity()), 0x7C00);
  uint16_t nan = f32_to_f16_bits(std::numeric_limits<float>::quiet_NaN());
  EXPECT_EQ(nan & 0x7C00, 0x7C00);
  EXPECT_NE(nan & 0x03FF, 0);
  EXPECT_EQ(f16_bits_to_f32(0x3C00), 1.0f);
  EXPECT_EQ(f16_bits_to_f32(0x7BFF), 65504.0f);
  EXPECT_EQ(f16_bits_to_f32(0x0001), std::ldexp(1.0f, -24));
  EXPECT_EQ(f16_bits_to_f32(0x8001), -std::ldexp(1.0f, -24));
  EXPECT_TRUE(std::isinf(f16_bits_to_f32(0x7C00)));
  EXPECT_TRUE(std::isnan(f16_bits_to_f32(0x7E00)));
}

TEST(DtypeF16, ExhaustiveRoundTrip) {
  for (uint32_t h = 0; h < 65536; ++h) {
    float v = f16_bits_to_f32(uint16_t(h));
    if (std::isnan(v)) {
      EXPECT_TRUE(std::isnan(f16_bits_to_f32(f32_to_f16_bits(v)))) << h;
      continue;
    }
    ASSERT_EQ(f32_to_f16_bits(v), uint16_t(h)) << "h=" << h;
    ASSERT_EQ(round_to(DType::f16, v), v);
  }
}

#if defined(__FLT16_MAX__)
TEST(DtypeF16, MatchesCompilerFloat16OnRandomInputs) {
  const uint64_t key = punica::hash_key(1, 2, 3);
  for (uint64_t i = 0; i < 400000; ++i) {
    uint32_t bits = uint32_t(punica::splitmix64(key + i));
    // half the samples in the fp16 range (exponents 100..145), the rest anywhere
    if (i & 1) bits = (bits & 0x807fffffu) | ((100u + uint32_t(i >> 1) % 46u) << 23);
    float v = f(bits);
    if (std::isnan(v)) continue;
    _Float16 h = static_cast<_Float16>(v);
    uint16_t want;
    std::memcpy(&want, &h, 2);
    ASSERT_EQ(f32_to_f16_bits(v), want) << std::hex << "bits=0x" << bits;
  }
}
#endif

TEST(DtypeBf16, KnownValues) {
  EXPECT_EQ(f32_to_bf16_bits(1.0f), 0x3F80);
  EXPECT_EQ(f32_to_bf16_bits(-1.0f), 0xBF80);
  EXPECT_EQ(f32_to_bf16_bits(1.0f + std::ldexp(1.0f, -8)), 0x3F80);  // tie -> even (down)
  EXPECT_EQ(f32_to_bf16_bits(1.0f + std::ldexp(3.0f, -8)), 0x3F82);  // tie -> even (up)
  EXPECT_EQ(f32_to_bf16_bits(1.0f + std::ldexp(1.0f, -8) + std::ldexp(1.0f, -20)), 0x3F81);
  EXPECT_EQ(f32_to_bf16_bits(65504.0f), 0x4780);  // 65536 in bf16
  EXPECT_EQ(f32_to_bf16_bits(std::numeric_limits<float>::max()), 0x7F80);  // rounds to Inf
  EXPECT_EQ(f32_to_bf16_bits(std::numeric_limits<float>::infinity()), 0x7F80);
  EXPECT_EQ(f32_to_bf16_bits(f(0x00010000u)), 0x0001);  // fp32 subnormal kept exactly
  EXPECT_EQ(f32_to_bf16_bits(f(0x00008000u)), 0x0000);  // half a bf16 subnormal ulp -> even 0
  EXPECT_EQ(f32_to_bf16_bits(f(0x00018000u)), 0x0002);  // 1.5 ulp -> 2 (even)
  uint16_t nan = f32_to_bf16_bits(f(0x7f800001u));       // signalling NaN with low payload
  EXPECT_TRUE(std::isnan(bf16_bits_to_f32(nan)));        // must not become Inf
  EXPECT_EQ(bf16_bits_to_f32(0x3F80), 1.0f);
  EXPECT_EQ(bf16_bits_to_f32(0x0001), f(0x00010000u));
}

TEST(DtypeBf16, ExhaustiveRoundTrip) {
  for (uint32_t h = 0; h < 65536; ++h) {
    float v = bf16_bits_to_f32(uint16_t(h));
    if (std::isnan(v)) {
      EXPECT_TRUE(std::isnan(bf16_bits_to_f32(f32_to_bf16_bits(v)))) << h;
      continue;
    }
    ASSERT_EQ(f32_to_bf16_bits(v), uint16_t(h)) << "h=" << h;
    ASSERT_EQ(round_to(DType::bf16, v), v);
  }
}

TEST(DtypeBf16, MatchesExactRoundingOnRandomInputs) {
  const uint64_t key = punica::hash_key(4, 5, 6);
  for (uint64_t i = 0; i < 400000; ++i) {
    uint32_t bits = uint32_t(punica::splitmix64(key + i));
    if (i % 4 == 0) bits = (bits & 0xffff0000u) | 0x8000u;  // exact ties
    float v = f(bits);
    if (std::isnan(v) || std::isinf(v)) continue;
    ASSERT_EQ(f32_to_bf16_bits(v), bf16_oracle(v)) << std::hex << "bits=0x" << bits;
  }
}

TEST(Dtype, LoadStoreAndRoundTo) {
  uint16_t buf[4];
  float fb[2];
  store_elem(buf, DType::f16, 1, 0.1f);
  EXPECT_EQ(load_elem(buf, DType::f16, 1), round_to(DType::f16, 0.1f));
  EXPECT_NE(round_to(DType::f16, 0.1f), 0.1f);
  store_elem(buf, DType::bf16, 2, 0.1f);
  EXPECT_EQ(load_elem(buf, DType::bf16, 2), round_to(DType::bf16, 0.1f));
  EXPECT_NE(round_to(DType::bf16, 0.1f), round_to(DType::f16, 0.1f));
  store_elem(fb, DType::f32, 1, 0.1f);
  EXPECT_EQ(load_elem(fb, DType::f32, 1), 0.1f);
  EXPECT_EQ(round_to(DType::f32, 0.1f), 0.1f);
  EXPECT_EQ(dtype_size(DType::f32), 4u);
  EXPECT_EQ(dtype_size(DType::bf16), 2u);
  DType t;
  EXPECT_TRUE(parse_dtype("bfloat16", t));
  EXPECT_EQ(t, DType::bf16);
  EXPECT_TRUE(parse_dtype("half", t));
  EXPECT_EQ(t, DType::f16);
  EXPECT_FALSE(parse_dtype("fp8", t));
}
