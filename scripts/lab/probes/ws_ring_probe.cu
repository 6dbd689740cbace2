// Probe (not part of the suite's build): does a warp-specialized stage ring hide the prefill shrink's
// math behind its x stream where a block-wide barrier per stage does not? (results/TARGETS.md, "what
// would close it": producer warps and mbarriers instead of a barrier per stage.)
// The x stream of the one-slice rank-16 shrink at H=8192, T=8192 with one adapter: 64 tiles of 128
// rows x 8192 k (bf16, 128 MB), k split 4 ways (256 blocks, as fused128_sk's aligned stream-K grid),
// stages of 128 rows x 64 k (16 KB) plus 16 rank rows of A (2 KB, L2-resident), XOR-swizzled.
//   sync  256 threads; cp.async ring, cp.async.wait_group ST-2 + __syncthreads per stage, then the
//         math, then the copies of stage it+ST-1 (the order of the suite's fused tile)
//   ws    8 consumer warps + 1 producer warp; the producer waits for a stage's `empty` mbarrier,
//         copies it with cp.async and lets cp.async.mbarrier.arrive.noinc complete its `full`
//         mbarrier; consumers wait on `full`, do the math, arrive on `empty`: no block barrier
//   math  per warp and stage what the fused 128-token tile's SASS shows: 4 k16 steps x (2 ldmatrix.x4
//         of x + 1 of A + 4 mma.m16n8k16), i.e. 12 LDSM + 16 HMMA (warps w and w+4 take the same 32
//         rows: the instruction load is the point, not the sums); "nomath": one shared load per stage
// Epilogues of the sync ring with math (EPI): none; `store` (each tile's first k split stores its
// 128 x 16 partial sums with plain stores: what a split reduced inside a cluster would leave, without
// the reduction itself); `zero+atomic` (the shipped structure: a zero kernel over y first, the ring
// kernel its programmatic dependent, griddepcontrol.wait and then every split's float4 atomics).
// `+hint`: x copied in the suite's form (a source size and an L2 evict_first cache hint).
// Blocks per SM are set by the dynamic shared memory asked for. Timed as punica-bench times an op
// (probe_timing.cuh: cold = events per call over 2 rotated 128 MB buffers, median of 30; graph = one
// graph of 32 calls). A bare grid-stride read of the same 128 MB is the reference (probe_read.cuh).
// Build: nvcc -O3 -std=c++17 -arch=sm_90a -o ws_ring_probe scripts/lab/probes/ws_ring_probe.cu
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include "probe_read.cuh"
#include "probe_timing.cuh"

namespace {
constexpr int BM = 128, BK = 64, KSPLIT = 4;
constexpr int XB = BM * BK * 2, AB = 16 * BK * 2, SB = XB + AB;  // bytes per stage: 16 KB x + 2 KB A

__device__ __forceinline__ uint32_t smem_u32(const void* p) { return uint32_t(__cvta_generic_to_shared(p)); }
__device__ __forceinline__ void cp16(uint32_t dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(src) : "memory");
}
// the suite's form of the x copies: a source size (16, or 0 to zero-fill) and an L2 evict_first hint
__device__ __forceinline__ void cp16_hint(uint32_t dst, const void* src, uint64_t policy) {
  asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2, %3;\n" ::"r"(dst), "l"(src), "r"(16),
               "l"(policy)
               : "memory");
}
// byte offset of 16-byte chunk c of row r in a stage (chunk XOR row: ldmatrix's 8 rows on 8 bank groups)
__device__ __forceinline__ uint32_t swz(int r, int c) { return uint32_t(r * 8 + (c ^ (r & 7))) * 16u; }
__device__ __forceinline__ void ldsm4(uint32_t (&f)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(f[0]), "=r"(f[1]), "=r"(f[2]), "=r"(f[3])
               : "r"(addr));
}
__device__ __forceinline__ void mma16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
  asm volatile("{\n .reg .b64 st;\n mbarrier.arrive.shared::cta.b64 st, [%0];\n}\n" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  asm volatile(
      "{\n .reg .pred p;\n WAIT_%=:\n mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n @!p bra WAIT_%=;\n}\n" ::"r"(bar),
      "r"(parity)
      : "memory");
}
__device__ __forceinline__ void cp_async_arrive_noinc(uint32_t bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(bar) : "memory");
}

// One stage's math for warp `warp` (see the header), accumulating into acc.
template <bool MATH>
__device__ __forceinline__ void consume(uint32_t stage, int warp, int lane, float (&acc)[2][2][4]) {
  if (!MATH) {
    uint32_t v;
    asm volatile("ld.shared.b32 %0, [%1];\n" : "=r"(v) : "r"(stage + uint32_t(warp * 32 + lane) * 4u));
    acc[0][0][0] += __uint_as_float(v & 0x3f800000u);
    return;
  }
  const int wm = warp & 3;
#pragma unroll
  for (int ks = 0; ks < 4; ++ks) {
    uint32_t a0[4], a1[4], b[4];
    ldsm4(a0, stage + swz(wm * 32 + (lane & 15), 2 * ks + (lane >> 4)));
    ldsm4(a1, stage + swz(wm * 32 + 16 + (lane & 15), 2 * ks + (lane >> 4)));
    ldsm4(b, stage + XB + swz((lane >> 4) * 8 + (lane & 7), 2 * ks + ((lane >> 3) & 1)));
    mma16816(acc[0][0], a0, b[0], b[1]);
    mma16816(acc[0][1], a0, b[2], b[3]);
    mma16816(acc[1][0], a1, b[0], b[1]);
    mma16816(acc[1][1], a1, b[2], b[3]);
  }
}
__device__ __forceinline__ void keep(const float (&acc)[2][2][4], float* out) {
  float s = 0.f;
#pragma unroll
  for (int i = 0; i < 16; ++i) s += (&acc[0][0][0])[i];
  if (s == 1234.5f) out[0] = s;  // never true for this data: keeps the math
}

enum Epi { kNone = 0, kStore = 1, kZeroAtomic = 2 };
__global__ void __launch_bounds__(256) zero_y(float4* y, int n4) {
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n4; i += gridDim.x * blockDim.x) y[i] = make_float4(0.f, 0.f, 0.f, 0.f);
}
// The 128 x 16 partial sums of a tile into y [T][16] fp32: warps 0-3 hold rows 32w..32w+31 (mma C layout).
template <int EPI>
__device__ __forceinline__ void epilogue(const float (&acc)[2][2][4], int warp, int lane, int row0, bool first, float* y) {
  if (EPI == kNone || warp >= 4) return;
  if (EPI == kStore && !first) return;
  if (EPI == kZeroAtomic) asm volatile("griddepcontrol.wait;" ::: "memory");
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int nt = 0; nt < 2; ++nt)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int r = row0 + warp * 32 + mt * 16 + (lane >> 2) + 8 * h, c = nt * 8 + 2 * (lane & 3);
        float2* yp = reinterpret_cast<float2*>(y + size_t(r) * 16 + c);
        const float2 v = make_float2(acc[mt][nt][2 * h], acc[mt][nt][2 * h + 1]);
        if (EPI == kStore) *yp = v;
        else atomicAdd(yp, v);
      }
}

template <int ST, bool MATH, int BPS, int EPI = kNone, bool HINT = false>
__global__ void __launch_bounds__(256, BPS) ring_sync(const __nv_bfloat16* __restrict__ x, const __nv_bfloat16* __restrict__ a,
                                                      int K, float* out) {
  extern __shared__ __align__(1024) uint8_t sm[];
  const uint32_t base = smem_u32(sm);
  const int tile = blockIdx.x / KSPLIT, nkt = (K / BK) / KSPLIT, kt0 = (blockIdx.x % KSPLIT) * nkt;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, ch = tid & 7, lr = tid >> 3;
  const char* xg = reinterpret_cast<const char*>(x + (size_t(tile) * BM + lr) * K + size_t(kt0) * BK + ch * 8);
  const char* ag = reinterpret_cast<const char*>(a + size_t(lr & 15) * K + size_t(kt0) * BK + ch * 8);
  uint64_t pol = 0;
  if (HINT) asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(pol));
  auto load = [&](int s, int it) {
    const uint32_t sb = base + uint32_t(s) * SB;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const char* src = xg + (size_t(32 * i) * K + size_t(it) * BK) * 2;
      if (HINT) cp16_hint(sb + swz(lr + 32 * i, ch), src, pol);
      else cp16(sb + swz(lr + 32 * i, ch), src);
    }
    if (tid < 128) cp16(sb + XB + swz(lr, ch), ag + size_t(it) * BK * 2);
  };
#pragma unroll
  for (int s = 0; s < ST - 1; ++s) {
    if (s < nkt) load(s, s);
    asm volatile("cp.async.commit_group;\n" ::: "memory");
  }
  float acc[2][2][4] = {};
  for (int it = 0; it < nkt; ++it) {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(ST - 2) : "memory");
    __syncthreads();
    consume<MATH>(base + uint32_t(it % ST) * SB, warp, lane, acc);
    if (it + ST - 1 < nkt) load((it + ST - 1) % ST, it + ST - 1);
    asm volatile("cp.async.commit_group;\n" ::: "memory");
  }
  if (EPI == kNone) keep(acc, out);
  else epilogue<EPI>(acc, warp, lane, tile * BM, blockIdx.x % KSPLIT == 0, out);
}

template <int ST, bool MATH, int BPS>
__global__ void __launch_bounds__(288, BPS) ring_ws(const __nv_bfloat16* __restrict__ x, const __nv_bfloat16* __restrict__ a,
                                                    int K, float* out) {
  extern __shared__ __align__(1024) uint8_t sm[];
  const uint32_t base = smem_u32(sm), full = base + ST * SB, empty = full + ST * 8;
  const int tile = blockIdx.x / KSPLIT, nkt = (K / BK) / KSPLIT, kt0 = (blockIdx.x % KSPLIT) * nkt;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  if (tid == 0) {
    for (int s = 0; s < ST; ++s) {
      mbar_init(full + 8 * s, 32);  // the producer's 32 lanes, each when its copies of the stage land
      mbar_init(empty + 8 * s, 8);  // one arrival per consumer warp
    }
  }
  __syncthreads();
  if (warp == 8) {  // producer: chunk lane + 32j of the stage's 1024 x chunks (row 4j + lane/8), 128 A chunks
    const int ch = lane & 7, r0 = lane >> 3;
    const char* xg = reinterpret_cast<const char*>(x + (size_t(tile) * BM + r0) * K + size_t(kt0) * BK + ch * 8);
    const char* ag = reinterpret_cast<const char*>(a + size_t(r0) * K + size_t(kt0) * BK + ch * 8);
    for (int it = 0; it < nkt; ++it) {
      const int s = it % ST;
      if (it >= ST) mbar_wait(empty + 8 * s, uint32_t((it / ST - 1) & 1));
      const uint32_t sb = base + uint32_t(s) * SB;
      const size_t ko = size_t(it) * BK * 2;
#pragma unroll 8
      for (int j = 0; j < 32; ++j) cp16(sb + swz(r0 + 4 * j, ch), xg + size_t(4 * j) * K * 2 + ko);
#pragma unroll
      for (int j = 0; j < 4; ++j) cp16(sb + XB + swz(r0 + 4 * j, ch), ag + size_t(4 * j) * K * 2 + ko);
      cp_async_arrive_noinc(full + 8 * s);
    }
    asm volatile("cp.async.wait_all;\n" ::: "memory");
    return;
  }
  float acc[2][2][4] = {};
  for (int it = 0; it < nkt; ++it) {
    const int s = it % ST;
    mbar_wait(full + 8 * s, uint32_t((it / ST) & 1));
    consume<MATH>(base + uint32_t(s) * SB, warp, lane, acc);
    __syncwarp();
    if (lane == 0) mbar_arrive(empty + 8 * s);
  }
  keep(acc, out);
}

}  // namespace

int main() {
  cudaStream_t st;
  CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  int sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  const int T = 8192, K = 8192, tiles = T / BM;
  const size_t xbytes = size_t(T) * K * 2;
  __nv_bfloat16 *x, *a;
  float* out;
  CK(cudaMalloc(&x, 2 * xbytes));  // two rotated copies (256 MB, > 2x L2)
  CK(cudaMalloc(&a, size_t(16) * K * 2));
  CK(cudaMalloc(&out, 1 << 20));
  CK(cudaMemset(x, 0x3c, 2 * xbytes));  // bf16 1.17: finite
  CK(cudaMemset(a, 0x3c, size_t(16) * K * 2));
  const double bytes = double(xbytes) + 16.0 * K * 2;
  time_it("bare read 128MB 4 blk/SM", double(xbytes), [&](int i, cudaStream_t s) {
    read_linear<<<sms * 4, 256, 0, s>>>(reinterpret_cast<const uint4*>(reinterpret_cast<char*>(x) + (i % 2) * xbytes),
                                        xbytes / 16, out);
  }, st);
  auto run = [&](const char* name, auto kern, int threads, int stages, int bps) {
    const int need = stages * SB + 2 * stages * 8;
    const int smem = std::max(need, (227 * 1024) / bps - 1024);
    CK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    int occ = 0;
    CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, kern, threads, smem));
    char full[96];
    std::snprintf(full, sizeof full, "%s ST=%d %d/SM", name, stages, occ);
    time_it(full, bytes, [&](int i, cudaStream_t s) {
      kern<<<tiles * KSPLIT, threads, smem, s>>>(x + (i % 2) * (xbytes / 2), a, K, out);
    }, st);
  };
  run("sync nomath", ring_sync<4, false, 2>, 256, 4, 2);
  run("sync math", ring_sync<4, true, 2>, 256, 4, 2);
  run("ws nomath", ring_ws<4, false, 2>, 288, 4, 2);
  run("ws math", ring_ws<4, true, 2>, 288, 4, 2);
  run("sync math", ring_sync<4, true, 3>, 256, 4, 3);
  run("ws math", ring_ws<4, true, 3>, 288, 4, 3);
  run("ws math", ring_ws<6, true, 2>, 288, 6, 2);
  run("ws nomath", ring_ws<6, false, 2>, 288, 6, 2);
  run("sync math +store", ring_sync<4, true, 2, kStore>, 256, 4, 2);
  // the shipped structure: zero kernel, then the ring as its programmatic dependent with atomics;
  // HINT: x copied as the suite copies it (source size, L2 evict_first)
  const int n4 = T * 16 / 4;
  auto shipped = [&](const char* name, auto kern) {
    const int smem = std::max(4 * SB, (227 * 1024) / 2 - 1024);
    CK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    time_it(name, bytes + T * 16 * 4.0, [&](int i, cudaStream_t s) {
      zero_y<<<128, 256, 0, s>>>(reinterpret_cast<float4*>(out), n4);
      cudaLaunchConfig_t cfg = {};
      cfg.gridDim = dim3(tiles * KSPLIT);
      cfg.blockDim = dim3(256);
      cfg.dynamicSmemBytes = smem;
      cfg.stream = s;
      cudaLaunchAttribute at[1];
      at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
      at[0].val.programmaticStreamSerializationAllowed = 1;
      cfg.attrs = at;
      cfg.numAttrs = 1;
      CK(cudaLaunchKernelEx(&cfg, kern, static_cast<const __nv_bfloat16*>(x + (i % 2) * (xbytes / 2)),
                            static_cast<const __nv_bfloat16*>(a), K, out));
    }, st);
  };
  shipped("sync math +zero+atomic ST=4 2/SM", ring_sync<4, true, 2, kZeroAtomic>);
  shipped("sync math +zero+atomic +hint ST=4 2/SM", ring_sync<4, true, 2, kZeroAtomic, true>);
  run("sync math +hint ST=4", ring_sync<4, true, 2, kNone, true>, 256, 4, 2);
  {
    time_it("zero kernel alone (512 KB)", T * 16 * 4.0, [&](int, cudaStream_t s) {
      zero_y<<<128, 256, 0, s>>>(reinterpret_cast<float4*>(out), n4);
    }, st);
  }
  CK(cudaGetLastError());
  CK(cudaDeviceSynchronize());
  return 0;
}
