// Counter-based input generator: value = f(seed, case, tensor, index), so the CPU and the GPU
// backends, every rank's shard and a filtered rerun all see the same inputs without copying.
#pragma once
#include <cstdint>
#include <string>

// The integer and float helpers below also compile for the device (device_fill_uniform_bf16); the
// string hash stays host-only.
#if defined(__CUDACC__)
#define PUNICA_HD __host__ __device__
#else
#define PUNICA_HD
#endif

namespace punica {

PUNICA_HD inline uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}
// FNV-1a of a string (case ids, tensor names) mixed once more.
inline uint64_t hash_string(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) { h ^= c; h *= 1099511628211ull; }
  return splitmix64(h);
}
PUNICA_HD inline uint64_t hash_key(uint64_t seed, uint64_t case_hash, uint64_t tensor_id) {
  return splitmix64(seed ^ splitmix64(case_hash ^ splitmix64(tensor_id)));
}
// Uniform in [-1, 1) from a key and a flat element index.
PUNICA_HD inline float hash_uniform(uint64_t key, uint64_t index) {
  uint64_t r = splitmix64(key ^ (index * 0xd1b54a32d192ed03ull));
  return float(double(r >> 40) * (1.0 / 8388608.0) - 1.0);  // 24 random bits
}
// Uniform integer in [0, n).
PUNICA_HD inline uint64_t hash_below(uint64_t key, uint64_t index, uint64_t n) {
  return n ? splitmix64(key ^ (index * 0x9e3779b97f4a7c15ull + 0x632be59bd9b4e019ull)) % n : 0;
}
// Small-integer value for the exact check mode: {-2..2} * 2^-3 (products and sums stay exact).
PUNICA_HD inline float hash_small_int(uint64_t key, uint64_t index) {
  return float(int64_t(hash_below(key, index, 5)) - 2) * 0.125f;
}

}  // namespace punica
