// Host stand-ins (block_emu.h) for the device helpers kernels/bgmv_moe_lora_delta uses from
// lora_elem.cuh and lora_device.cuh: conversions, 16-byte loads, the warp sum, and mma.sync
// m16n8k16 emulated across the 32 fibers of a warp (fragments exchanged through a warp buffer,
// the PTX fragment layout), plus fp32 atomics. Included instead of those headers by delta_emu_check.sh.
#pragma once
#include "scripts/lab/probes/block_emu/block_emu.h"
#include "kernels/common/dtype.h"
namespace punica::kernels {
namespace elem {
inline float to_f(float v) { return v; }
inline float to_f(__half v) { return __half2float(v); }
inline float to_f(__nv_bfloat16 v) { return __bfloat162float(v); }
template <class T> inline T from_f(float v);
template <> inline float from_f<float>(float v) { return v; }
template <> inline __half from_f<__half>(float v) { return __float2half_rn(v); }
template <> inline __nv_bfloat16 from_f<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }
template <class T> inline void load_vec(const T* p, float (&f)[8]) {
  if (reinterpret_cast<uintptr_t>(p) % 16) { std::fprintf(stderr, "misaligned 16-byte load\n"); std::abort(); }
  for (int i = 0; i < 8; ++i) f[i] = to_f(p[i]);
}
template <class T> inline void unpack(const uint4& u, float (&f)[8]) {
  T e[8];
  std::memcpy(e, &u, 16);
  for (int i = 0; i < 8; ++i) f[i] = to_f(e[i]);
}
template <class F> void dispatch_dtype(DType t, F&& f) {
  switch (t) {
    case DType::f32: f(float{}); break;
    case DType::f16: f(__half{}); break;
    case DType::bf16: f(__nv_bfloat16{}); break;
  }
}
}  // namespace elem
namespace lora_dev {
inline float warp_sum(float v) {
  for (int o = 16; o; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
// Programmatic dependent launch: launches run one after another here, so the wait has nothing to
// wait for (a read before it is still a read of what the previous launch wrote).
inline void pdl_wait() {}
inline void pdl_launch_dependents() {}
template <class... Params, class... Args>
inline void launch_kernel(void (*kernel)(Params...), dim3 grid, dim3 block, std::size_t smem, cudaStream_t, bool,
                          Args&&... args) {
  ::emu::launch([&](int) { kernel(args...); }, grid, block.x, smem, 0);
}
// cp.async: each fiber's copies are queued and land only at its cp_async_wait (a read of the
// destination before the wait and its barrier sees the old bytes, as it may on the GPU).
struct AsyncCopy { void* dst; const void* src; int bytes; long group; };
inline std::vector<AsyncCopy> async_q[1024];
inline long async_groups[1024];
inline void* smem_u32(void* p) { return p; }
inline void cp_async16(void* dst, const void* src, int src_bytes) {
  if (reinterpret_cast<uintptr_t>(dst) % 16 || (src_bytes > 0 && reinterpret_cast<uintptr_t>(src) % 16)) {
    std::fprintf(stderr, "misaligned cp.async\n");
    std::abort();
  }
  const int lin = ::emu::fibers[::emu::cur].lin;
  async_q[lin].push_back({dst, src, src_bytes, async_groups[lin]});
}
inline void cp_async_commit() { ++async_groups[::emu::fibers[::emu::cur].lin]; }
template <int N> inline void cp_async_wait() {  // completes every group but the newest N
  const int lin = ::emu::fibers[::emu::cur].lin;
  std::vector<AsyncCopy> keep;
  for (const AsyncCopy& a : async_q[lin]) {
    if (a.group < async_groups[lin] - N) {
      std::memset(a.dst, 0, 16);
      if (a.bytes > 0) std::memcpy(a.dst, a.src, size_t(a.bytes));
    } else {
      keep.push_back(a);
    }
  }
  async_q[lin] = keep;
}
inline uint32_t mma_a[32][32][4], mma_b[32][32][2];
template <class T> struct MmaOp {
  static float half_of(uint32_t w, int hi) {
    T v;
    const uint16_t b = uint16_t(hi ? w >> 16 : w & 0xffffu);
    std::memcpy(&v, &b, 2);
    return elem::to_f(v);
  }
  static void run(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    const int lin = ::emu::fibers[::emu::cur].lin, w = lin / 32, l = lin % 32;
    for (int i = 0; i < 4; ++i) mma_a[w][l][i] = a[i];
    mma_b[w][l][0] = b0;
    mma_b[w][l][1] = b1;
    ::emu::syncwarp();
    // A[m][k]: lane (m%8)*4 + (k%8)/2, reg (m/8) + 2*(k/8), half k%2. B[k][n]: lane n*4 + (k%8)/2, reg k/8.
    auto A = [&](int m, int k) { return half_of(mma_a[w][(m % 8) * 4 + (k % 8) / 2][(m / 8) + 2 * (k / 8)], k % 2); };
    auto B = [&](int k, int n) { return half_of(mma_b[w][n * 4 + (k % 8) / 2][k / 8], k % 2); };
    const int g = l / 4, c = l % 4;
    for (int i = 0; i < 4; ++i) {
      const int m = g + 8 * (i / 2), n = 2 * c + i % 2;
      float s = 0;
      for (int k = 0; k < 16; ++k) s += A(m, k) * B(k, n);
      d[i] += s;
    }
    ::emu::syncwarp();
  }
};
}  // namespace lora_dev
}  // namespace punica::kernels
