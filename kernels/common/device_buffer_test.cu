// device_fill_uniform_bf16 (the GEMM ceiling's operands) gives exactly the host generator's values,
// rounded to bf16 the way the host rounds, over an odd length that ends inside the last grid-stride
// pass; and device_fill_pattern fills every element of an odd length.
#include <gtest/gtest.h>
#include <cstdint>
#include <cstring>
#include <set>
#include <vector>
#include "kernels/common/cuda_check.h"
#include "kernels/common/device_buffer.h"
#include "kernels/common/dtype.h"
#include "kernels/common/hash_rng.h"

namespace punica::kernels::testing {
namespace {

TEST(DeviceFill, UniformBf16MatchesTheHostGenerator) {
  // More elements than one grid-stride pass (4096 blocks × 256 threads) covers, and an odd count.
  const std::size_t n = std::size_t(4096) * 256 * 2 + 4099;
  const uint64_t key = splitmix64(77);
  DeviceBuffer buf((n + 8) * 2);
  std::vector<uint16_t> poison(n + 8, 0x7fc1);  // a NaN: an element left unwritten cannot pass
  buf.upload(poison.data(), poison.size() * 2);
  device_fill_uniform_bf16(buf.get(), n, key, nullptr);
  PUNICA_CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<uint16_t> got(n + 8);
  buf.download(got.data(), got.size() * 2);

  std::size_t mismatches = 0;
  std::set<uint16_t> distinct;
  double sum = 0;
  std::size_t upper_half = 0;  // |v| >= 0.5: half of a uniform draw on [-1, 1)
  for (std::size_t i = 0; i < n; ++i) {
    const uint16_t want = f32_to_bf16_bits(hash_uniform(key, i));
    if (got[i] != want && ++mismatches <= 5)
      ADD_FAILURE() << "element " << i << ": device 0x" << std::hex << got[i] << ", host 0x" << want;
    const float v = bf16_bits_to_f32(got[i]);
    ASSERT_GE(v, -1.0f) << "element " << i;
    ASSERT_LE(v, 1.0f) << "element " << i;
    distinct.insert(got[i]);
    sum += v;
    upper_half += v >= 0.5f || v <= -0.5f;
  }
  EXPECT_EQ(mismatches, 0u);
  // Not a constant fill. A uniform draw of 2M values hits each of the 128 bf16 values of a binade
  // [2^-k, 2^-k+1) about 2M * 2^-k / 256 times: every value down to k = 13, so ~13 * 128 * 2 of them.
  EXPECT_GT(distinct.size(), 3000u);
  EXPECT_NEAR(sum / double(n), 0.0, 0.01);
  EXPECT_NEAR(double(upper_half) / double(n), 0.5, 0.01);
  for (std::size_t i = n; i < n + 8; ++i) EXPECT_EQ(got[i], 0x7fc1) << "wrote past n at " << i;
}

TEST(DeviceFill, PatternFillsEveryElement) {
  const std::size_t n = 1000003;
  DeviceBuffer buf((n + 4) * 4);
  std::vector<uint32_t> zeros(n + 4, 0);
  buf.upload(zeros.data(), zeros.size() * 4);
  device_fill_pattern(buf.get(), n, 4, 0xdeadbeefu, nullptr);
  PUNICA_CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<uint32_t> got(n + 4);
  buf.download(got.data(), got.size() * 4);
  std::size_t bad = 0;
  for (std::size_t i = 0; i < n; ++i) bad += got[i] != 0xdeadbeefu;
  EXPECT_EQ(bad, 0u);
  for (std::size_t i = n; i < n + 4; ++i) EXPECT_EQ(got[i], 0u) << "wrote past n at " << i;
}

}  // namespace
}  // namespace punica::kernels::testing
