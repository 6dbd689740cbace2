// vLLM lora_expand (add_expand): y[t, c_s + n] (+)= round_w(B_s[l] @ round_w(x[s, t, :r_l]))[n] for
// tokens with slot l. Wide-N GEMV for decode (lanes split a B row, 16-byte loads, a group of tokens
// shares each load) and, for prefill, mma.sync tiles of 128 tokens x 128 columns whose y tile is
// staged through shared memory (16-byte coalesced loads issued before the products, 16-byte stores);
// the older 64 x 128 kernel with a fragment-layout y epilogue stays as an alternative, and a persistent
// software-pipelined variant (expand_mma_persistent: one block per SM, several y tiles in flight).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <algorithm>
#include <atomic>
#include <type_traits>
#include "kernels/common/cuda_check.h"
#include "kernels/common/error.h"
#include "kernels/lora_expand/heuristics.h"
#include "kernels/lora_expand/lora_expand.h"
#include "kernels/lora_expand/lora_expand_internal.h"
#include "kernels/lora_shrink/lora_device.cuh"

namespace punica::kernels {
namespace {
using namespace lora_dev;
namespace H = expand_heur;

struct ExpandParams {
  const void* x;               // [S,T,R] of TI, or partials [nsplit,S,T,R] fp32
  const void* b[kMaxSlices];
  int64_t n[kMaxSlices];
  int64_t col[kMaxSlices];     // first output column of each slice (offset_start included)
  int64_t T;
  int S, L, R;
  const int32_t* ranks;
  LoraMetaView meta;
  void* y;
  int64_t ldy;
  int add;
  int pair_ok;  // y row stride, slice columns and base even: 4-byte pair accesses
  int y16_ok;   // y row stride, slice columns and base keep 16-byte alignment
  int x_vec;    // x base 16-byte aligned and R % 4 == 0: 4-rank vector loads of x
  int nsplit;
};

// Input value x[s, t, k] as the weight dtype would see it (vLLM casts fp32 x before the dot).
template <class T, class TI, bool FROM_PART>
__device__ __forceinline__ float load_x(const ExpandParams& p, int s, int t, int k) {
  if (FROM_PART) {
    const float* part = static_cast<const float*>(p.x);
    float v = 0.f;
    for (int ks = 0; ks < p.nsplit; ++ks) v += part[((int64_t(ks) * p.S + s) * p.T + t) * p.R + k];
    return round_to<T>(v);
  } else {
    return round_to<T>(to_f<TI>(static_cast<const TI*>(p.x)[(int64_t(s) * p.T + t) * p.R + k]));
  }
}

template <class T>
__device__ __forceinline__ void write_y(const ExpandParams& p, T* yp, float acc) {
  const float v = round_to<T>(acc);
  *yp = from_f<T>(p.add ? to_f<T>(*yp) + v : v);
}

// ---------------------------------------------------------------- wide-N GEMV (decode)
// grid (ceil(max N / kGemvCols), S, L + 1 entries). G lanes (power of two covering r/8 vectors)
// share one B row; a warp covers 32/G columns per step; kGemvTokens tokens reuse each B load.
template <class T, class TI, bool VECB, bool FROM_PART>
__global__ void __launch_bounds__(H::kGemvThreads) expand_gemv_kernel(ExpandParams p) {
  constexpr int TB = H::kGemvTokens;
  extern __shared__ __align__(16) float xs[];  // [TB][R8]
  if (*p.meta.no_lora_flag) return;
  const int entry = blockIdx.z;
  const int l = p.meta.active_lora_ids[entry];
  if (l < 0) return;
  const int s = blockIdx.y;
  const int64_t Ns = p.n[s];
  const int64_t n0 = int64_t(blockIdx.x) * H::kGemvCols;
  if (n0 >= Ns) return;
  const int64_t nend = min(Ns, n0 + H::kGemvCols);
  const int r = p.ranks[l];
  const int R8 = (p.R + 7) & ~7;
  const int nvec = (r + 7) >> 3;
  const int G = nvec <= 1 ? 1 : nvec <= 2 ? 2 : nvec <= 4 ? 4 : nvec <= 8 ? 8 : nvec <= 16 ? 16 : 32;
  const int cpw = 32 / G;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int lig = lane & (G - 1), cidx = lane / G;
  const T* B = static_cast<const T*>(p.b[s]) + int64_t(l) * Ns * p.R;
  const int ntok = p.meta.num_tokens_per_lora[entry];
  const int start = p.meta.lora_token_start_loc[entry];
  T* Y = static_cast<T*>(p.y) + p.col[s];

  if (FROM_PART) {
    // Pull this block's B rows towards L2 while the shrink grid finishes.
    for (int64_t c = n0 + threadIdx.x; c < nend; c += blockDim.x)
      asm volatile("prefetch.global.L2 [%0];" ::"l"(B + c * p.R));
    pdl_wait();
  }

  __shared__ int stok[TB];
  for (int g = 0; g < ntok; g += TB) {
    __syncthreads();
    if (threadIdx.x < TB) stok[threadIdx.x] = g + threadIdx.x < ntok ? p.meta.sorted_token_ids[start + g + threadIdx.x] : -1;
    for (int idx = threadIdx.x; idx < TB * R8; idx += blockDim.x) {
      const int tt = idx / R8, k = idx % R8;
      float v = 0.f;
      if (g + tt < ntok && k < r) v = load_x<T, TI, FROM_PART>(p, s, p.meta.sorted_token_ids[start + g + tt], k);
      xs[tt * R8 + k] = v;
    }
    __syncthreads();
    for (int64_t cb = n0 + int64_t(warp) * cpw; cb < nend; cb += int64_t(H::kGemvThreads / 32) * cpw) {
      const int64_t c = cb + cidx;
      const bool valid = c < nend;
      float acc[TB];
#pragma unroll
      for (int tt = 0; tt < TB; ++tt) acc[tt] = 0.f;
      if (valid) {
        const T* brow = B + c * p.R;
        for (int kv = lig; kv < nvec; kv += G) {
          const int k = kv * 8;
          float b[8];
          if (VECB && k + 8 <= r) {
            load8<T>(brow + k, b);
          } else {
#pragma unroll
            for (int e = 0; e < 8; ++e) b[e] = (k + e < r) ? to_f<T>(brow[k + e]) : 0.f;
          }
#pragma unroll
          for (int tt = 0; tt < TB; ++tt) {
            const float4 x0 = *reinterpret_cast<const float4*>(xs + tt * R8 + k);
            const float4 x1 = *reinterpret_cast<const float4*>(xs + tt * R8 + k + 4);
            acc[tt] = fmaf(b[0], x0.x, acc[tt]); acc[tt] = fmaf(b[1], x0.y, acc[tt]);
            acc[tt] = fmaf(b[2], x0.z, acc[tt]); acc[tt] = fmaf(b[3], x0.w, acc[tt]);
            acc[tt] = fmaf(b[4], x1.x, acc[tt]); acc[tt] = fmaf(b[5], x1.y, acc[tt]);
            acc[tt] = fmaf(b[6], x1.z, acc[tt]); acc[tt] = fmaf(b[7], x1.w, acc[tt]);
          }
        }
      }
      for (int off = G >> 1; off; off >>= 1)
#pragma unroll
        for (int tt = 0; tt < TB; ++tt) acc[tt] += __shfl_xor_sync(0xffffffffu, acc[tt], off);
      if (valid && lig == 0) {
        // All old values first (independent loads in flight), then the stores.
        float old[TB];
#pragma unroll
        for (int tt = 0; tt < TB; ++tt)
          old[tt] = (p.add && stok[tt] >= 0) ? to_f<T>(Y[int64_t(stok[tt]) * p.ldy + c]) : 0.f;
#pragma unroll
        for (int tt = 0; tt < TB; ++tt)
          if (stok[tt] >= 0) Y[int64_t(stok[tt]) * p.ldy + c] = from_f<T>(old[tt] + round_to<T>(acc[tt]));
      }
    }
  }
}

// ---------------------------------------------------------------- mma.sync tiles (prefill)
template <class T> struct Pair;
template <> struct Pair<__nv_bfloat16> {
  static __device__ __forceinline__ float2 load(const void* p) {
    return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(p));
  }
  static __device__ __forceinline__ void store(void* p, float a, float b) {
    *reinterpret_cast<__nv_bfloat162*>(p) = __floats2bfloat162_rn(a, b);
  }
};
template <> struct Pair<__half> {
  static __device__ __forceinline__ float2 load(const void* p) {
    return __half22float2(*reinterpret_cast<const __half2*>(p));
  }
  static __device__ __forceinline__ void store(void* p, float a, float b) {
    *reinterpret_cast<__half2*>(p) = __floats2half2_rn(a, b);
  }
};

// grid (ceil(max N / 128), flat token tiles bound, S). 4 warps as 2 x 2, each 32 tokens x 64 cols.
template <class T, class TI, bool VECB>
__global__ void __launch_bounds__(H::kMmaThreads) expand_mma_kernel(ExpandParams p) {
  constexpr int BM = H::kMmaBM, BN = H::kMmaBN, BK = H::kMmaBK;
  __shared__ __align__(128) uint4 sx[BM * 8];
  __shared__ __align__(128) uint4 sb[BN * 8];
  __shared__ int stok[BM];
  if (*p.meta.no_lora_flag) return;
  const int s = blockIdx.z;
  const int64_t Ns = p.n[s];
  const int64_t n0 = int64_t(blockIdx.x) * BN;
  if (n0 >= Ns) return;
  int entry, tile;
  if (!find_tile(p.meta, p.L + 1, BM, blockIdx.y, entry, tile)) return;
  const int l = p.meta.active_lora_ids[entry];
  const int r = p.ranks[l];
  const int ntok = p.meta.num_tokens_per_lora[entry];
  const int m0 = tile * BM;
  const int rows = min(BM, ntok - m0);
  const int start = p.meta.lora_token_start_loc[entry] + m0;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int wm = warp >> 1, wn = warp & 1;
  const T* B = static_cast<const T*>(p.b[s]) + (int64_t(l) * Ns + n0) * p.R;
  const int64_t nvalid = Ns - n0 < BN ? Ns - n0 : int64_t(BN);
  if (tid < BM) stok[tid] = tid < rows ? p.meta.sorted_token_ids[start + tid] : -1;
  __syncthreads();
  const int g = lane >> 2, q = lane & 3;
  T* Y = static_cast<T*>(p.y) + p.col[s] + n0;
  // The y values this thread updates, loaded before the products so their latency overlaps.
  uint32_t yv[2][2][8];
#pragma unroll
  for (int mi = 0; mi < 2; ++mi)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int t = stok[wm * 32 + mi * 16 + g + 8 * h];
#pragma unroll
      for (int ni = 0; ni < 8; ++ni) {
        const int col = wn * 64 + ni * 8 + 2 * q;
        yv[mi][h][ni] = 0u;
        if (p.add && p.pair_ok && t >= 0 && col + 1 < nvalid)
          yv[mi][h][ni] = *reinterpret_cast<const uint32_t*>(Y + int64_t(t) * p.ldy + col);
      }
    }

  float acc[2][8][4];
#pragma unroll
  for (int a = 0; a < 2; ++a)
#pragma unroll
    for (int b = 0; b < 8; ++b)
#pragma unroll
      for (int c = 0; c < 4; ++c) acc[a][b][c] = 0.f;

  for (int k0 = 0; k0 < max(r, 1); k0 += BK) {
    if (k0 > 0) __syncthreads();
    // B tile: rows n, chunks of 8 ranks; never reads ranks >= r.
#pragma unroll
    for (int i = 0; i < BN * 8 / H::kMmaThreads; ++i) {
      const int row = (tid >> 3) + 16 * i, ch = tid & 7;
      const int k = k0 + ch * 8;
      const T* src = B + int64_t(row) * p.R + k;
      if (VECB && row < nvalid && k + 8 <= r) {
        cp_async16(smem_u32(sb + swz(row, ch)), src, 16);
      } else {
        __align__(16) T v[8];
#pragma unroll
        for (int e = 0; e < 8; ++e) v[e] = (row < nvalid && k + e < r) ? src[e] : from_f<T>(0.f);
        sb[swz(row, ch)] = *reinterpret_cast<const uint4*>(v);
      }
    }
    cp_async_commit();
    // x tile, rounded to T: 4 consecutive ranks per thread, 16 threads per row (coalesced).
    {
      uint2* sx2 = reinterpret_cast<uint2*>(sx);
#pragma unroll
      for (int i = 0; i < BM * 16 / H::kMmaThreads; ++i) {
        const int idx = tid + i * H::kMmaThreads;
        const int row = idx >> 4, quad = idx & 15;
        const int t = stok[row];
        __align__(8) T v[4];
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int k = k0 + quad * 4 + e;
          v[e] = from_f<T>((t >= 0 && k < r) ? load_x<T, TI, false>(p, s, t, k) : 0.f);
        }
        sx2[swz(row, quad >> 1) * 2 + (quad & 1)] = *reinterpret_cast<const uint2*>(v);
      }
    }
    cp_async_wait<0>();
    __syncthreads();
    const int nks = min(BK / 16, (r - k0 + 15) / 16);
    for (int kk = 0; kk < nks; ++kk) {
      uint32_t af[2][4];
#pragma unroll
      for (int mi = 0; mi < 2; ++mi)
        ldmatrix_x4(af[mi], smem_u32(sx + swz(wm * 32 + mi * 16 + (lane & 15), kk * 2 + (lane >> 4))));
#pragma unroll
      for (int pn = 0; pn < 4; ++pn) {
        const int mi8 = lane >> 3;
        uint32_t bf[4];
        ldmatrix_x4(bf, smem_u32(sb + swz(wn * 64 + pn * 16 + (mi8 >> 1) * 8 + (lane & 7), kk * 2 + (mi8 & 1))));
#pragma unroll
        for (int mi = 0; mi < 2; ++mi) {
          MmaOp<T>::run(acc[mi][2 * pn], af[mi], bf[0], bf[1]);
          MmaOp<T>::run(acc[mi][2 * pn + 1], af[mi], bf[2], bf[3]);
        }
      }
    }
  }

#pragma unroll
  for (int mi = 0; mi < 2; ++mi)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = wm * 32 + mi * 16 + g + 8 * h;
      const int t = stok[row];
      if (t < 0) continue;
      T* yrow = Y + int64_t(t) * p.ldy;
#pragma unroll
      for (int ni = 0; ni < 8; ++ni) {
        const int col = wn * 64 + ni * 8 + 2 * q;
        if (col >= nvalid) continue;
        const float v0 = round_to<T>(acc[mi][ni][2 * h]);
        const float v1 = round_to<T>(acc[mi][ni][2 * h + 1]);
        T* yp = yrow + col;
        if (p.pair_ok && col + 1 < nvalid) {
          const float2 o = Pair<T>::load(&yv[mi][h][ni]);
          Pair<T>::store(yp, o.x + v0, o.y + v1);
        } else {
          yp[0] = from_f<T>(p.add ? to_f<T>(yp[0]) + v0 : v0);
          if (col + 1 < nvalid) yp[1] = from_f<T>(p.add ? to_f<T>(yp[1]) + v1 : v1);
        }
      }
    }
}

// ---------------------------------------------------------------- staged mma.sync tiles (prefill)
// grid (ceil(max N / BN), flat token tiles bound, S); block = BM tokens of one adapter (gathered
// through sorted_token_ids) x BN columns of one slice, 8 warps as 4 x 2 (32 tokens x 64 cols each).
// The y tile is requested first (cp.async into shared memory, 16-byte chunks, 16 threads per row)
// so that its DRAM latency overlaps the x / B staging and the products; the rounded products are
// added to it in shared memory and the finished tile leaves in coalesced 16-byte stores.
template <class T, class TI, int MINB>
__global__ void __launch_bounds__(H::kStThreads, MINB) expand_mma_staged_kernel(ExpandParams p) {
  constexpr int BM = H::kStBM, BN = H::kStBN, BK = H::kStBK, NT = H::kStThreads, YP = H::kStYPitch;
  extern __shared__ __align__(128) uint4 smem[];
  uint4* sx = smem;                                            // [BM][BK] swizzled
  uint4* sb = smem + BM * (BK / 8);                            // [BN][BK] swizzled
  T* sy = reinterpret_cast<T*>(smem + (BM + BN) * (BK / 8));   // [BM][YP]
  __shared__ int stok[BM];
  if (*p.meta.no_lora_flag) return;
  const int s = blockIdx.z;
  const int64_t Ns = p.n[s];
  const int64_t n0 = int64_t(blockIdx.x) * BN;
  if (n0 >= Ns) return;
  int entry, tile;
  if (!find_tile(p.meta, p.L + 1, BM, blockIdx.y, entry, tile)) return;
  const int l = p.meta.active_lora_ids[entry];
  const int r = p.ranks[l];
  const int ntok = p.meta.num_tokens_per_lora[entry];
  const int m0 = tile * BM;
  const int rows = min(BM, ntok - m0);
  const int start = p.meta.lora_token_start_loc[entry] + m0;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int wm = warp >> 1, wn = warp & 1;
  const T* B = static_cast<const T*>(p.b[s]) + (int64_t(l) * Ns + n0) * p.R;
  const int nvalid = Ns - n0 < BN ? int(Ns - n0) : BN;
  const bool vec = p.y16_ok;
  T* Y = static_cast<T*>(p.y) + p.col[s] + n0;
  if (tid < BM) stok[tid] = tid < rows ? p.meta.sorted_token_ids[start + tid] : -1;
  __syncthreads();

  // Stages rank chunk [k0, k0 + 16 * nks) of B (cp.async, committed) and of x (rounded to T).
  auto stage = [&](int k0, int nks) {
#pragma unroll
    for (int i = 0; i < BN * (BK / 8) / NT; ++i) {
      const int idx = tid + i * NT;
      const int row = idx >> 3, ch = idx & 7;
      if (ch >= 2 * nks) continue;
      const int k = k0 + ch * 8;
      const T* src = B + int64_t(row) * p.R + k;
      if (row < nvalid && k + 8 <= r) {
        cp_async16(smem_u32(sb + swz(row, ch)), src, 16);
      } else {
        __align__(16) T v[8];
#pragma unroll
        for (int e = 0; e < 8; ++e) v[e] = (row < nvalid && k + e < r) ? src[e] : from_f<T>(0.f);
        sb[swz(row, ch)] = *reinterpret_cast<const uint4*>(v);
      }
    }
    cp_async_commit();
    uint2* sx2 = reinterpret_cast<uint2*>(sx);
#pragma unroll
    for (int i = 0; i < BM * (BK / 4) / NT; ++i) {
      const int idx = tid + i * NT;
      const int row = idx >> 4, quad = idx & 15;
      if (quad >= 4 * nks) continue;
      const int t = stok[row];
      const int k = k0 + quad * 4;
      __align__(8) T v[4];
      if (t >= 0 && k + 4 <= r && p.x_vec) {
        const TI* src = static_cast<const TI*>(p.x) + (int64_t(s) * p.T + t) * p.R + k;
        if constexpr (std::is_same_v<TI, float>) {
          const float4 f = __ldg(reinterpret_cast<const float4*>(src));
          v[0] = from_f<T>(f.x); v[1] = from_f<T>(f.y); v[2] = from_f<T>(f.z); v[3] = from_f<T>(f.w);
        } else {
          const uint2 u = __ldg(reinterpret_cast<const uint2*>(src));
          const TI* h = reinterpret_cast<const TI*>(&u);
#pragma unroll
          for (int e = 0; e < 4; ++e) v[e] = from_f<T>(to_f<TI>(h[e]));
        }
      } else {
#pragma unroll
        for (int e = 0; e < 4; ++e)
          v[e] = from_f<T>((t >= 0 && k + e < r) ? load_x<T, TI, false>(p, s, t, k + e) : 0.f);
      }
      sx2[swz(row, quad >> 1) * 2 + (quad & 1)] = *reinterpret_cast<const uint2*>(v);
    }
  };

  const int nks0 = min(BK / 16, (max(r, 1) + 15) / 16);
  stage(0, nks0);
  // The y tile (only when it is added to): 16-byte chunks, chunk c of row c / 16.
  if (p.add) {
#pragma unroll
    for (int i = 0; i < BM * (BN / 8) / NT; ++i) {
      const int idx = tid + i * NT;
      const int row = idx >> 4, col = (idx & 15) * 8;
      const int t = stok[row];
      if (t < 0 || col >= nvalid) continue;
      const T* src = Y + int64_t(t) * p.ldy + col;
      T* dst = sy + row * YP + col;
      if (vec) {
        cp_async16(smem_u32(dst), src, 2 * min(8, nvalid - col));
      } else {
        for (int e = 0; e < 8 && col + e < nvalid; ++e) dst[e] = src[e];
      }
    }
  }
  cp_async_commit();

  float acc[2][8][4];
#pragma unroll
  for (int a = 0; a < 2; ++a)
#pragma unroll
    for (int b = 0; b < 8; ++b)
#pragma unroll
      for (int c = 0; c < 4; ++c) acc[a][b][c] = 0.f;

  for (int k0 = 0; k0 < max(r, 1); k0 += BK) {
    const int nks = min(BK / 16, (r - k0 + 15) / 16);
    if (k0 > 0) {
      __syncthreads();
      stage(k0, nks);
      cp_async_wait<0>();
    } else {
      cp_async_wait<1>();  // B staged; the y group may still be in flight
    }
    __syncthreads();
    for (int kk = 0; kk < nks; ++kk) {
      uint32_t af[2][4];
#pragma unroll
      for (int mi = 0; mi < 2; ++mi)
        ldmatrix_x4(af[mi], smem_u32(sx + swz(wm * 32 + mi * 16 + (lane & 15), kk * 2 + (lane >> 4))));
#pragma unroll
      for (int pn = 0; pn < 4; ++pn) {
        const int mi8 = lane >> 3;
        uint32_t bf[4];
        ldmatrix_x4(bf, smem_u32(sb + swz(wn * 64 + pn * 16 + (mi8 >> 1) * 8 + (lane & 7), kk * 2 + (mi8 & 1))));
#pragma unroll
        for (int mi = 0; mi < 2; ++mi) {
          MmaOp<T>::run(acc[mi][2 * pn], af[mi], bf[0], bf[1]);
          MmaOp<T>::run(acc[mi][2 * pn + 1], af[mi], bf[2], bf[3]);
        }
      }
    }
  }
  cp_async_wait<0>();
  __syncthreads();

  // Rounded products (+ old y) into the shared tile; each thread owns its fragment elements.
  const int g = lane >> 2, q = lane & 3;
#pragma unroll
  for (int mi = 0; mi < 2; ++mi)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = wm * 32 + mi * 16 + g + 8 * h;
#pragma unroll
      for (int ni = 0; ni < 8; ++ni) {
        const int col = wn * 64 + ni * 8 + 2 * q;
        T* d = sy + row * YP + col;
        float v0 = round_to<T>(acc[mi][ni][2 * h]);
        float v1 = round_to<T>(acc[mi][ni][2 * h + 1]);
        if (p.add) {
          const float2 o = Pair<T>::load(d);
          v0 += o.x;
          v1 += o.y;
        }
        Pair<T>::store(d, v0, v1);
      }
    }
  __syncthreads();

#pragma unroll
  for (int i = 0; i < BM * (BN / 8) / NT; ++i) {
    const int idx = tid + i * NT;
    const int row = idx >> 4, col = (idx & 15) * 8;
    const int t = stok[row];
    if (t < 0 || col >= nvalid) continue;
    T* dst = Y + int64_t(t) * p.ldy + col;
    const T* src = sy + row * YP + col;
    if (vec && col + 8 <= nvalid) {
      *reinterpret_cast<uint4*>(dst) = *reinterpret_cast<const uint4*>(src);
    } else {
      for (int e = 0; e < 8 && col + e < nvalid; ++e) dst[e] = src[e];
    }
  }
}

// ---------------------------------------------------------------- persistent pipelined mma (prefill)
// One block of 256 threads per SM walks a contiguous range of tiles; tile = (adapter entry, BM-token
// chunk, slice, BN-column chunk), columns fastest so that consecutive tiles of a block gather the
// same token rows. Per tile: token ids -> y tile (cp.async 16 B into a ring of NS shared stages) and
// x / B of the whole rank (cp.async, one buffer, zero-filled past the adapter's rank) -> mma.sync ->
// rounded products added into the y stage -> 16-byte coalesced stores.
// Issue is split by role so that each thread's cp.async FIFO holds one kind of traffic: warps
// 0..3 issue only y tiles (tile i + NS - 1 is issued while tile i is computed, NS - 1 tiles in
// flight), warps 4..7 issue x / B of tile i + 1 (after tile i's products) and the token ids of tile
// i + NS. Thread 0 decodes the tile sequence one step ahead into a small ring of descriptors.
struct PsArgs {
  int ns;  // y stages
  int rk;  // staged rank (max_rank rounded up to 16)
  int nc;  // column tiles over all slices
};
struct PsLayout {
  int xp, bp;  // x / B row pitch in elements
  unsigned y_off, x_off, b_off, tok_off, desc_off, cur_off, total;
};
__host__ __device__ inline unsigned ps_align(unsigned v) { return (v + 127u) & ~127u; }
__host__ __device__ inline PsLayout ps_layout(int bm, int bn, int ns, int rk, int ti_size) {
  PsLayout L;
  L.xp = rk + 8;
  L.bp = rk + 8;
  L.y_off = 0;
  L.x_off = ps_align(L.y_off + unsigned(ns) * bm * (bn + 8) * 2u);
  L.b_off = ps_align(L.x_off + unsigned(bm) * L.xp * ti_size);
  L.tok_off = ps_align(L.b_off + unsigned(bn) * L.bp * 2u);
  L.desc_off = ps_align(L.tok_off + unsigned(ns + 1) * bm * 4u);
  L.cur_off = ps_align(L.desc_off + unsigned(ns + 2) * 8u * 4u);
  L.total = ps_align(L.cur_off + 16u * 4u);
  return L;
}

// Tile descriptor (8 ints in shared memory).
enum { kDValid, kDSlice, kDN0, kDNvalid, kDLora, kDRank, kDTStart, kDRows };
// Tile cursor of thread 0 (shared memory, so that it holds no registers through the loop).
enum { kCLeft, kCEntry, kCM, kCMe, kCS, kCNt, kCL, kCR, kCCnt, kCStart };

// Number of BM-token tiles over the active entries (whole warp).
__device__ __forceinline__ int ps_count_mtiles(const LoraMetaView& m, int n_entries, int bm) {
  const int lane = threadIdx.x & 31;
  int total = 0;
  for (int c = 0; c < n_entries; c += 32) {
    const int i = c + lane;
    int cnt = 0;
    if (i < n_entries && m.active_lora_ids[i] >= 0) cnt = (m.num_tokens_per_lora[i] + bm - 1) / bm;
#pragma unroll
    for (int o = 16; o; o >>= 1) cnt += __shfl_xor_sync(0xffffffffu, cnt, o);
    total += cnt;
  }
  return total;
}

__device__ __forceinline__ void ps_load_entry(const ExpandParams& p, int* c, int bm) {
  const int e = c[kCEntry];
  const int l = p.meta.active_lora_ids[e];
  const int cnt = p.meta.num_tokens_per_lora[e];
  c[kCL] = l;
  c[kCR] = p.ranks[l];
  c[kCCnt] = cnt;
  c[kCStart] = p.meta.lora_token_start_loc[e];
  c[kCMe] = (cnt + bm - 1) / bm;
}

// Writes the cursor's tile into descriptor d (invalid once the range is exhausted) and advances.
template <int BM, int BN>
__device__ void ps_cursor_step(const ExpandParams& p, int* c, int* d) {
  if (c[kCLeft] <= 0) {
    d[kDValid] = 0;
    return;
  }
  const int s = c[kCS], nt = c[kCNt], m = c[kCM];
  const int64_t Ns = p.n[s];
  d[kDValid] = 1;
  d[kDSlice] = s;
  d[kDN0] = nt * BN;
  d[kDNvalid] = int(Ns - int64_t(nt) * BN < BN ? Ns - int64_t(nt) * BN : int64_t(BN));
  d[kDLora] = c[kCL];
  d[kDRank] = c[kCR];
  d[kDTStart] = c[kCStart] + m * BM;
  d[kDRows] = min(BM, c[kCCnt] - m * BM);
  if (--c[kCLeft] <= 0) return;
  if (int64_t(nt + 1) * BN < Ns) {
    c[kCNt] = nt + 1;
    return;
  }
  c[kCNt] = 0;
  int s2 = s + 1;
  while (s2 < p.S && p.n[s2] == 0) ++s2;
  if (s2 < p.S) {
    c[kCS] = s2;
    return;
  }
  s2 = 0;
  while (p.n[s2] == 0) ++s2;
  c[kCS] = s2;
  if (m + 1 < c[kCMe]) {
    c[kCM] = m + 1;
    return;
  }
  c[kCM] = 0;
  int e = c[kCEntry] + 1;
  while (!(p.meta.active_lora_ids[e] >= 0 && p.meta.num_tokens_per_lora[e] > 0)) ++e;
  c[kCEntry] = e;
  ps_load_entry(p, c, BM);
}

// 4-byte cp.async (L1-allocating), zero-filled when src_bytes == 0.
__device__ __forceinline__ void cp_async4(uint32_t dst, const void* src, int src_bytes) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes)
               : "memory");
}
__device__ __forceinline__ void cp_async_wait_dyn(int n) {
  switch (n) {
    case 0: cp_async_wait<0>(); break;
    case 1: cp_async_wait<1>(); break;
    case 2: cp_async_wait<2>(); break;
    default: cp_async_wait<3>(); break;
  }
}

// Two consecutive x values as a packed pair of T (vLLM rounds x to the weight dtype).
template <class T, class TI>
__device__ __forceinline__ uint32_t ps_xpair(const TI* src) {
  if constexpr (std::is_same_v<TI, T>) {
    return *reinterpret_cast<const uint32_t*>(src);
  } else {
    float a, b;
    if constexpr (std::is_same_v<TI, float>) {
      const float2 f = *reinterpret_cast<const float2*>(src);
      a = f.x;
      b = f.y;
    } else {
      a = to_f<TI>(src[0]);
      b = to_f<TI>(src[1]);
    }
    uint32_t u;
    Pair<T>::store(&u, a, b);
    return u;
  }
}

template <class T, class TI, int BM, int BN>
__global__ void __launch_bounds__(H::kPsThreads, 2) expand_mma_persistent_kernel(ExpandParams p, PsArgs a) {
  constexpr int NT = H::kPsThreads, WN = BN / 64, YP = BN + 8, HALF = NT / 2;
  static_assert((BM / 32) * WN == NT / 32, "8 warps of 32 tokens x 64 columns");
  static_assert(BM <= HALF, "one token id per issuing thread");
  extern __shared__ __align__(128) unsigned char ps_smem[];
  if (*p.meta.no_lora_flag) return;
  const PsLayout lay = ps_layout(BM, BN, a.ns, a.rk, int(sizeof(TI)));
  T* const sy = reinterpret_cast<T*>(ps_smem + lay.y_off);
  TI* const sx = reinterpret_cast<TI*>(ps_smem + lay.x_off);
  T* const sb = reinterpret_cast<T*>(ps_smem + lay.b_off);
  int* const stok = reinterpret_cast<int*>(ps_smem + lay.tok_off);
  int* const sdesc = reinterpret_cast<int*>(ps_smem + lay.desc_off);
  int* const scur = reinterpret_cast<int*>(ps_smem + lay.cur_off);
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int NS = a.ns;
  const bool ywarp = tid < HALF;
  const int htid = ywarp ? tid : tid - HALF;

  // ---- this block's tile range, cursor, first NS + 1 descriptors
  if (warp == 0) {
    const int n_entries = p.L + 1;
    const int64_t n = int64_t(ps_count_mtiles(p.meta, n_entries, BM)) * a.nc;
    const int64_t f0 = n * blockIdx.x / gridDim.x, f1 = n * (blockIdx.x + 1) / gridDim.x;
    int e = 0, m = 0;
    if (f1 > f0) find_tile(p.meta, n_entries, BM, int(f0 / a.nc), e, m);
    if (lane == 0) {
      scur[kCLeft] = int(f1 - f0);
      if (f1 > f0) {
        int ct = int(f0 % a.nc), s = 0;
        for (;; ++s) {
          const int nts = int((p.n[s] + BN - 1) / BN);
          if (ct < nts) break;
          ct -= nts;
        }
        scur[kCEntry] = e;
        scur[kCM] = m;
        scur[kCS] = s;
        scur[kCNt] = ct;
        ps_load_entry(p, scur, BM);
      }
      scur[15] = int(f1 - f0);
      for (int j = 0; j <= NS; ++j) ps_cursor_step<BM, BN>(p, scur, sdesc + j * 8);
    }
  }
  __syncthreads();
  const int count = scur[15];
  if (count <= 0) return;

  // ---- issue helpers
  auto desc = [&](int j) { return sdesc + (j % (NS + 2)) * 8; };
  auto toks = [&](int j) { return stok + (j % (NS + 1)) * BM; };
  auto load_tok = [&](int j) {  // warps 4..7
    const int* d = desc(j);
    if (!d[kDValid] || htid >= BM) return;
    const bool ok = htid < d[kDRows];
    cp_async4(smem_u32(toks(j) + htid), p.meta.sorted_token_ids + (ok ? d[kDTStart] + htid : 0), ok ? 4 : 0);
  };
  auto issue_y = [&](int j) {  // warps 0..3
    const int* d = desc(j);
    if (!d[kDValid] || !p.add) return;
    const int rows = d[kDRows], nvalid = d[kDNvalid];
    const int* tk = toks(j);
    const T* Y = static_cast<const T*>(p.y) + p.col[d[kDSlice]] + d[kDN0];
    T* dst0 = sy + (j % NS) * (BM * YP);
#pragma unroll 4
    for (int idx = htid; idx < BM * BN / 8; idx += HALF) {
      const int row = idx / (BN / 8), col = (idx % (BN / 8)) * 8;
      if (row >= rows || col >= nvalid) continue;
      cp_async16(smem_u32(dst0 + row * YP + col), Y + int64_t(tk[row]) * p.ldy + col, 2 * min(8, nvalid - col));
    }
  };
  auto issue_xb = [&](int j) {  // warps 4..7
    const int* d = desc(j);
    if (!d[kDValid]) return;
    const int s = d[kDSlice], r = d[kDRank], rows = d[kDRows], nvalid = d[kDNvalid];
    const int* tk = toks(j);
    constexpr int CE = 16 / int(sizeof(TI));
    // The x buffer still holds tile j - 1's rows when tile j gathers the same tokens of one slice.
    const int* dp = desc(j + NS + 1);  // = desc(j - 1)
    const bool same_x = j > 0 && dp[kDValid] && dp[kDSlice] == s && dp[kDTStart] == d[kDTStart];
    const int xcpr = same_x ? 0 : a.rk / CE;
    const TI* X = static_cast<const TI*>(p.x);
    for (int idx = htid; idx < BM * xcpr; idx += HALF) {
      const int row = idx / xcpr, k = (idx - row * xcpr) * CE;
      const bool ok = row < rows && k < r;
      const TI* src = ok ? X + (int64_t(s) * p.T + tk[row]) * p.R + k : X;
      cp_async16(smem_u32(sx + row * lay.xp + k), src, ok ? min(CE, r - k) * int(sizeof(TI)) : 0);
    }
    const int bcpr = a.rk / 8;
    const int64_t Ns = p.n[s];
    const T* Bp = static_cast<const T*>(p.b[s]) + (int64_t(d[kDLora]) * Ns + d[kDN0]) * p.R;
    for (int idx = htid; idx < BN * bcpr; idx += HALF) {
      const int row = idx / bcpr, k = (idx - row * bcpr) * 8;
      const bool ok = row < nvalid && k < r;
      cp_async16(smem_u32(sb + row * lay.bp + k), ok ? Bp + int64_t(row) * p.R + k : Bp, ok ? 2 * min(8, r - k) : 0);
    }
  };

  // ---- prologue: token ids of tiles 0..NS-2, y of tiles 0..NS-2, x / B of tile 0 (+ ids of NS-1)
  if (!ywarp) {
    for (int j = 0; j <= NS - 2; ++j) load_tok(j);
    cp_async_commit();
    cp_async_wait<0>();
  }
  __syncthreads();
  if (ywarp) {
    for (int j = 0; j <= NS - 2; ++j) {
      issue_y(j);
      cp_async_commit();
    }
  } else {
    issue_xb(0);
    load_tok(NS - 1);
    cp_async_commit();
  }

  const int wm = warp / WN, wn = warp % WN;
  const int g = lane >> 2, q = lane & 3;
  for (int i = 0; i < count; ++i) {
    if (ywarp) cp_async_wait_dyn(NS - 2);
    else cp_async_wait<0>();
    __syncthreads();  // y / x / B / ids of tile i landed; stage (i - 1) % NS free
    if (tid == 0) ps_cursor_step<BM, BN>(p, scur, desc(i + NS + 1));
    if (ywarp) {
      issue_y(i + NS - 1);
      cp_async_commit();
    }
    const int* d = desc(i);
    const int r = d[kDRank];
    float acc[2][8][4];
#pragma unroll
    for (int x0 = 0; x0 < 2; ++x0)
#pragma unroll
      for (int x1 = 0; x1 < 8; ++x1)
#pragma unroll
        for (int x2 = 0; x2 < 4; ++x2) acc[x0][x1][x2] = 0.f;
    const int nk = (r + 15) >> 4;
    for (int kk = 0; kk < nk; ++kk) {
      uint32_t af[2][4];
#pragma unroll
      for (int mi = 0; mi < 2; ++mi) {
        const TI* xr = sx + (wm * 32 + mi * 16 + g) * lay.xp + kk * 16 + 2 * q;
        af[mi][0] = ps_xpair<T, TI>(xr);
        af[mi][1] = ps_xpair<T, TI>(xr + 8 * lay.xp);
        af[mi][2] = ps_xpair<T, TI>(xr + 8);
        af[mi][3] = ps_xpair<T, TI>(xr + 8 * lay.xp + 8);
      }
      const int mi8 = lane >> 3;
#pragma unroll
      for (int pn = 0; pn < 4; ++pn) {
        uint32_t bf[4];
        ldmatrix_x4(bf, smem_u32(sb + (wn * 64 + pn * 16 + (mi8 >> 1) * 8 + (lane & 7)) * lay.bp + kk * 16 + (mi8 & 1) * 8));
#pragma unroll
        for (int mi = 0; mi < 2; ++mi) {
          MmaOp<T>::run(acc[mi][2 * pn], af[mi], bf[0], bf[1]);
          MmaOp<T>::run(acc[mi][2 * pn + 1], af[mi], bf[2], bf[3]);
        }
      }
    }
    // Rounded products (+ old y) into the y stage; each thread owns its fragment elements.
    T* const st = sy + (i % NS) * (BM * YP);
#pragma unroll
    for (int mi = 0; mi < 2; ++mi)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int row = wm * 32 + mi * 16 + g + 8 * h;
#pragma unroll
        for (int ni = 0; ni < 8; ++ni) {
          T* e = st + row * YP + wn * 64 + ni * 8 + 2 * q;
          float v0 = round_to<T>(acc[mi][ni][2 * h]);
          float v1 = round_to<T>(acc[mi][ni][2 * h + 1]);
          if (p.add) {
            const float2 o = Pair<T>::load(e);
            v0 += o.x;
            v1 += o.y;
          }
          Pair<T>::store(e, v0, v1);
        }
      }
    __syncthreads();  // x / B free for tile i + 1; the y stage complete
    if (!ywarp) {
      issue_xb(i + 1);
      load_tok(i + NS);
      cp_async_commit();
    }
    {
      const int rows = d[kDRows], nvalid = d[kDNvalid];
      const int* tk = toks(i);
      T* Y = static_cast<T*>(p.y) + p.col[d[kDSlice]] + d[kDN0];
#pragma unroll 4
      for (int idx = tid; idx < BM * BN / 8; idx += NT) {
        const int row = idx / (BN / 8), col = (idx % (BN / 8)) * 8;
        if (row >= rows || col >= nvalid) continue;
        T* dst = Y + int64_t(tk[row]) * p.ldy + col;
        const T* src = st + row * YP + col;
        if (col + 8 <= nvalid) {
          *reinterpret_cast<uint4*>(dst) = *reinterpret_cast<const uint4*>(src);
        } else {
          for (int e = 0; e < nvalid - col; ++e) dst[e] = src[e];
        }
      }
    }
  }
  cp_async_wait<0>();
}

// ---------------------------------------------------------------- host side
bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

void validate(const LoraExpandArgs& a) {
  PUNICA_REQUIRE(a.num_slices >= 1 && a.num_slices <= kMaxSlices, ErrorKind::usage,
                 "lora_expand: num_slices must be in [1, 8]");
  PUNICA_REQUIRE(a.max_loras >= 0 && a.max_rank >= 0, ErrorKind::usage, "lora_expand: negative size");
  PUNICA_REQUIRE(a.max_loras + 1 <= 65535, ErrorKind::usage, "lora_expand: max_loras too large");
}

ExpandParams make_params(const LoraExpandArgs& a, int64_t& maxN) {
  ExpandParams p{};
  p.x = a.x;
  int64_t c = a.offset_start;
  maxN = 0;
  for (int s = 0; s < kMaxSlices; ++s) {
    p.b[s] = a.lora_b[s];
    p.n[s] = s < a.num_slices ? a.slice_width[s] : 0;
    p.col[s] = c;
    c += p.n[s];
    if (p.n[s] > maxN) maxN = p.n[s];
  }
  p.T = a.num_tokens;
  p.S = a.num_slices;
  p.L = a.max_loras;
  p.R = a.max_rank;
  p.ranks = a.lora_ranks;
  p.meta = a.meta;
  p.y = a.y;
  p.ldy = a.y_row_stride ? a.y_row_stride : c;
  p.add = a.add_inputs ? 1 : 0;
  p.pair_ok = (p.ldy % 2 == 0) && (reinterpret_cast<uintptr_t>(a.y) % 4 == 0);
  for (int s = 0; s < a.num_slices; ++s)
    if (p.col[s] % 2 != 0) p.pair_ok = 0;
  const std::size_t ysz = a.dtype == DType::f32 ? 4 : 2;
  p.y16_ok = ysz == 2 && (p.ldy % 8 == 0) && (reinterpret_cast<uintptr_t>(a.y) % 16 == 0);
  for (int s = 0; s < a.num_slices; ++s)
    if (p.col[s] % 8 != 0) p.y16_ok = 0;
  p.x_vec = (a.max_rank % 4 == 0) && aligned16(a.x);
  p.nsplit = 0;
  return p;
}

bool b_vec_ok(const LoraExpandArgs& a) {
  if (a.max_rank % 8 != 0) return false;
  for (int s = 0; s < a.num_slices; ++s)
    if (!aligned16(a.lora_b[s])) return false;
  return true;
}

template <class T, class TI, bool FROM_PART>
void launch_gemv(const ExpandParams& p, int64_t maxN, bool vecb, bool pdl, cudaStream_t st) {
  dim3 grid(unsigned((maxN + H::kGemvCols - 1) / H::kGemvCols), unsigned(p.S), unsigned(p.L + 1));
  const std::size_t smem = std::size_t(H::kGemvTokens) * ((p.R + 7) & ~7) * sizeof(float);
  PUNICA_REQUIRE(smem <= 48 * 1024, ErrorKind::usage, "lora_expand: max_rank too large");
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = dim3(H::kGemvThreads);
  cfg.dynamicSmemBytes = smem;
  cfg.stream = st;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = pdl ? 1 : 0;
  if (vecb) PUNICA_CUDA_CHECK(cudaLaunchKernelEx(&cfg, expand_gemv_kernel<T, TI, true, FROM_PART>, p));
  else PUNICA_CUDA_CHECK(cudaLaunchKernelEx(&cfg, expand_gemv_kernel<T, TI, false, FROM_PART>, p));
}

template <class T, class TI>
void launch_mma(const ExpandParams& p, int64_t maxN, cudaStream_t st) {
  const int64_t tiles = (p.T + H::kMmaBM - 1) / H::kMmaBM + p.L + 1;
  PUNICA_REQUIRE(tiles <= 65535, ErrorKind::usage, "lora_expand: too many tokens for one launch");
  dim3 grid(unsigned((maxN + H::kMmaBN - 1) / H::kMmaBN), unsigned(tiles), unsigned(p.S));
  expand_mma_kernel<T, TI, true><<<grid, H::kMmaThreads, 0, st>>>(p);
  PUNICA_CUDA_CHECK_LAUNCH();
}

template <class T, class TI, int MINB>
void launch_staged(const ExpandParams& p, int64_t maxN, cudaStream_t st) {
  const int64_t tiles = (p.T + H::kStBM - 1) / H::kStBM + p.L + 1;
  PUNICA_REQUIRE(tiles <= 65535, ErrorKind::usage, "lora_expand: too many tokens for one launch");
  dim3 grid(unsigned((maxN + H::kStBN - 1) / H::kStBN), unsigned(tiles), unsigned(p.S));
  constexpr std::size_t smem = std::size_t(H::kStBM + H::kStBN) * H::kStBK * 2 +
                               std::size_t(H::kStBM) * H::kStYPitch * sizeof(T);
  // The dynamic shared-memory limit is raised once per device (idempotent, so a race is harmless).
  static std::atomic<uint64_t> attr_set{0};
  int dev = 0;
  PUNICA_CUDA_CHECK(cudaGetDevice(&dev));
  const uint64_t bit = uint64_t(1) << (dev & 63);
  if (!(attr_set.load(std::memory_order_relaxed) & bit)) {
    PUNICA_CUDA_CHECK(cudaFuncSetAttribute(expand_mma_staged_kernel<T, TI, MINB>,
                                           cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    attr_set.fetch_or(bit, std::memory_order_relaxed);
  }
  expand_mma_staged_kernel<T, TI, MINB><<<grid, H::kStThreads, smem, st>>>(p);
  PUNICA_CUDA_CHECK_LAUNCH();
}

struct DeviceInfo {
  int sms = 0, smem_optin = 0;
};
DeviceInfo device_info() {
  // Per-device, read once (multiprocessor count, opt-in shared memory per block).
  static std::atomic<int> cache_sms[64], cache_smem[64];
  int dev = 0;
  PUNICA_CUDA_CHECK(cudaGetDevice(&dev));
  DeviceInfo d;
  const int slot = dev & 63;
  d.sms = cache_sms[slot].load(std::memory_order_relaxed);
  d.smem_optin = cache_smem[slot].load(std::memory_order_relaxed);
  if (d.sms <= 0) {
    PUNICA_CUDA_CHECK(cudaDeviceGetAttribute(&d.sms, cudaDevAttrMultiProcessorCount, dev));
    PUNICA_CUDA_CHECK(cudaDeviceGetAttribute(&d.smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
    cache_smem[slot].store(d.smem_optin, std::memory_order_relaxed);
    cache_sms[slot].store(d.sms, std::memory_order_relaxed);
  }
  return d;
}

bool persistent_ok(const LoraExpandArgs& a, const ExpandParams& p) {
  return a.dtype != DType::f32 && p.y16_ok && b_vec_ok(a) && aligned16(a.x) && a.max_rank % 8 == 0 &&
         a.max_rank <= H::kPsMaxRank;
}

// Launches the persistent kernel; false when the shared-memory plan does not fit (caller falls back).
template <class T, class TI, int BM, int BN>
bool launch_persistent(const ExpandParams& p, cudaStream_t st) {
  const DeviceInfo dv = device_info();
  const int rk = (std::max(p.R, 1) + 15) / 16 * 16;
  int ns = H::kPsMaxStages;
  while (ns >= H::kPsMinStages && int(ps_layout(BM, BN, ns, rk, int(sizeof(TI))).total) > dv.smem_optin) --ns;
  if (ns < H::kPsMinStages) return false;
  const unsigned smem = ps_layout(BM, BN, ns, rk, int(sizeof(TI))).total;
  int nc = 0;
  for (int s = 0; s < p.S; ++s) nc += int((p.n[s] + BN - 1) / BN);
  const int64_t bound = ((p.T + BM - 1) / BM + p.L) * int64_t(nc);
  const int grid = int(std::min<int64_t>(bound, dv.sms));
  if (grid <= 0) return true;
  static std::atomic<uint64_t> attr_set{0};
  int dev = 0;
  PUNICA_CUDA_CHECK(cudaGetDevice(&dev));
  const uint64_t bit = uint64_t(1) << (dev & 63);
  if (!(attr_set.load(std::memory_order_relaxed) & bit)) {
    PUNICA_CUDA_CHECK(cudaFuncSetAttribute(expand_mma_persistent_kernel<T, TI, BM, BN>,
                                           cudaFuncAttributeMaxDynamicSharedMemorySize, dv.smem_optin));
    attr_set.fetch_or(bit, std::memory_order_relaxed);
  }
  PsArgs pa{ns, rk, nc};
  expand_mma_persistent_kernel<T, TI, BM, BN><<<grid, H::kPsThreads, smem, st>>>(p, pa);
  PUNICA_CUDA_CHECK_LAUNCH();
  return true;
}

template <class T, class TI>
void dispatch(const LoraExpandArgs& a, const ExpandParams& p, int64_t maxN, cudaStream_t st,
              detail::ExpandPrefillKernel which) {
  using K = detail::ExpandPrefillKernel;
  const bool vecb = b_vec_ok(a);
  if constexpr (!std::is_same_v<T, float>) {
    if (H::use_mma(a.dtype, a.num_tokens, a.max_rank, vecb)) {
      const bool pers = which == K::automatic ? H::kUsePersistentPrefill
                                              : (which == K::mma_persistent || which == K::mma_persistent_wide);
      if (pers && persistent_ok(a, p)) {
        const bool wide = which == K::automatic ? H::kPsWide : which == K::mma_persistent_wide;
        if (wide ? launch_persistent<T, TI, 64, 256>(p, st) : launch_persistent<T, TI, 128, 128>(p, st)) return;
      }
      const bool staged = which == K::automatic || which == K::mma_persistent || which == K::mma_persistent_wide
                              ? H::kUseStagedPrefill
                              : which == K::mma_staged;
      if (which == K::mma_staged3) return launch_staged<T, TI, 3>(p, maxN, st);
      if (staged) return launch_staged<T, TI, H::kStMinBlocks>(p, maxN, st);
      return launch_mma<T, TI>(p, maxN, st);
    }
  }
  launch_gemv<T, TI, false>(p, maxN, vecb, false, st);
}

template <class T>
void dispatch_in(const LoraExpandArgs& a, const ExpandParams& p, int64_t maxN, cudaStream_t st,
                 detail::ExpandPrefillKernel which) {
  switch (a.in_dtype) {
    case DType::f32: dispatch<T, float>(a, p, maxN, st, which); break;
    case DType::f16: dispatch<T, __half>(a, p, maxN, st, which); break;
    case DType::bf16: dispatch<T, __nv_bfloat16>(a, p, maxN, st, which); break;
  }
}

}  // namespace

namespace detail {

void launch_lora_expand_with(const LoraExpandArgs& a, ExpandPrefillKernel which, cudaStream_t stream) {
  validate(a);
  if (a.num_tokens == 0 || a.max_loras == 0) return;
  int64_t maxN = 0;
  const ExpandParams p = make_params(a, maxN);
  if (maxN == 0) return;
  switch (a.dtype) {
    case DType::f32: dispatch_in<float>(a, p, maxN, stream, which); break;
    case DType::f16: dispatch_in<__half>(a, p, maxN, stream, which); break;
    case DType::bf16: dispatch_in<__nv_bfloat16>(a, p, maxN, stream, which); break;
  }
}

bool expand_persistent_applicable(const LoraExpandArgs& a) {
  int64_t maxN = 0;
  const ExpandParams p = make_params(a, maxN);
  return H::use_mma(a.dtype, a.num_tokens, a.max_rank, b_vec_ok(a)) && persistent_ok(a, p);
}

void launch_expand_from_partials(const LoraExpandArgs& a, const float* partials, int nsplit,
                                 cudaStream_t stream) {
  validate(a);
  if (a.num_tokens == 0 || a.max_loras == 0) return;
  int64_t maxN = 0;
  ExpandParams p = make_params(a, maxN);
  if (maxN == 0) return;
  p.x = partials;
  p.nsplit = nsplit;
  const bool vecb = b_vec_ok(a);
  switch (a.dtype) {
    case DType::f32: launch_gemv<float, float, true>(p, maxN, vecb, true, stream); break;
    case DType::f16: launch_gemv<__half, float, true>(p, maxN, vecb, true, stream); break;
    case DType::bf16: launch_gemv<__nv_bfloat16, float, true>(p, maxN, vecb, true, stream); break;
  }
}

}  // namespace detail

void launch_lora_expand(const LoraExpandArgs& a, cudaStream_t stream) {
  detail::launch_lora_expand_with(a, detail::ExpandPrefillKernel::automatic, stream);
}

}  // namespace punica::kernels
