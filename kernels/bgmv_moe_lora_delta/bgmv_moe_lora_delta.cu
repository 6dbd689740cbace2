// bgmv_moe_gemm1_lora_delta / bgmv_moe_gemm2_lora_delta on the device (SPEC §4.8.4-4.8.5). Two paths
// (heuristics.h):
// - pairs (decode): the shrink a block per (pair, slice, group of rank rows), its warps splitting K
//   when there are few rows (16-byte loads of A and x), the rank-r intermediate rounded to lora_dtype
//   into the workspace; then the expand column-tiled over the grid (a thread per 8 output columns,
//   16-byte loads of their B rows, one 16-byte store). gemm2's expand is per (token, column tile)
//   and sums the token's slots in registers: no atomics.
// - grouped (prefill): moe_lora_align groups the pairs by (adapter, expert); one block per
//   alignment block (16-64 pairs of one adapter and expert) runs the shrink and the expand as
//   mma.sync tiles (x rows gathered, A / B tiles staged in shared memory, the intermediate kept on
//   chip), the output stored from the mma registers (a quad transpose: 16 bytes a row at bm = 64). gemm1's rows of pairs
//   without an adapter are zeroed by a separate grid-stride kernel; gemm2 adds weighted rows into an
//   fp32 [T, H] accumulator (16-byte atomics) that a last kernel rounds into the output.
// Only each adapter's true rank is read (A rows / B columns past it never); no host synchronisation.
#include "kernels/bgmv_moe_lora_delta/bgmv_moe_lora_delta.h"
#include "kernels/common/mma_epilogue.cuh"
#include "kernels/common/vec_store.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <string>
#include <type_traits>

#include "kernels/add_lora_embedding/lora_elem.cuh"
#include "kernels/common/cuda_check.h"
#include "kernels/common/error.h"
#include "kernels/lora_shrink/lora_device.cuh"

namespace punica::kernels {
namespace {

using elem::from_f;
using elem::to_f;

constexpr int kThreads = 256;        // shrink and grouped blocks
constexpr int kWarps = kThreads / 32;
constexpr int kExpThreads = 128;     // pairs-path expand blocks
constexpr int kCols = 8;             // output columns per expand thread (one 16-byte store of 16-bit)
constexpr int kKCMax = 256;          // grouped shrink: K per shared-memory stage, at most (host picks kc)
constexpr int kPad = 8;              // shared rows padded by 16 bytes: conflict-free fragment reads
constexpr int kNT = bgmv_detail::kBgmvExpandCols;  // grouped expand: output columns per tile (heuristics.h plans with it)
constexpr int kMaxTiles = 16;        // grouped shrink: mma tiles per warp (64 pairs x 256 columns)
constexpr int kMaxPf = 8;            // grouped expand: 16-byte B pieces per thread per tile (64 rows x 256 rank)

struct Common {
  int64_t P;                 // pairs T*k
  int top_k, E, L, R;        // R: the tables' rank dim
  const int32_t* ranks;      // [L] or null
  const int32_t* lora_ids;   // [T]
  const int32_t* topk;       // [T*k]
  const int64_t* ta;         // A table: entry (s, e) at s*E + e
  const int64_t* tb;
  int64_t sa, sb;            // adapter strides (elements)
  int S;                     // slices
  int64_t K, N;              // A width, slice width
  const void* x;             // gemm1 x [T, K]; gemm2 act [rows, K]
  const int32_t* perm;       // gemm2: act row per pair; null: row = pair / k
  float scale;
};

// The slot of pair p when it has a delta, else -1.
__device__ __forceinline__ int slot_of(const Common& c, int64_t p) {
  const int l = c.lora_ids[p / c.top_k];
  if (l < 0 || l >= c.L) return -1;
  const int e = c.topk[p];
  if (e < 0 || e >= c.E) return -1;
  if (c.perm && c.perm[p] < 0) return -1;
  return l;
}
__device__ __forceinline__ int rank_of(const Common& c, int l) { return c.ranks ? max(0, min(c.ranks[l], c.R)) : c.R; }
__device__ __forceinline__ int64_t xrow_of(const Common& c, int64_t p) {
  return c.perm ? int64_t(c.perm[p]) : p / c.top_k;
}
template <class T>
__device__ __forceinline__ const T* wmat(const int64_t* tab, int idx, int64_t stride, int l) {
  return reinterpret_cast<const T*>(tab[idx]) + int64_t(l) * stride;
}
__device__ __forceinline__ bool al16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

// The bits of a 16-bit value, and of two packed into a 32-bit word (low first): register moves only.
// (Writing elements through a pointer into a uint4 took its address: SASS held it in local memory,
// a STL/LDL round trip per 16-byte piece, and built the stores from 32-bit pieces; ncu on the H100
// at 54cb5c7: 40% estimated from the local accesses, global stores at 8 of 32 bytes per sector.)
__device__ __forceinline__ uint32_t bits16(__half h) { return __half_as_ushort(h); }
__device__ __forceinline__ uint32_t bits16(__nv_bfloat16 h) { return __bfloat16_as_ushort(h); }
template <class TO>
__device__ __forceinline__ uint32_t pack2_bits(float a, float b) {
  return bits16(from_f<TO>(a)) | (bits16(from_f<TO>(b)) << 16);
}

// 8 elements from src (n valid, zero past them; zeros when src is null) as one 16-byte value.
template <class T>
__device__ __forceinline__ uint4 load8(const T* src, int64_t n) {
  static_assert(sizeof(T) == 2, "16-bit elements");
  if (!src || n <= 0) return make_uint4(0, 0, 0, 0);
  if (n >= 8 && al16(src)) return __ldg(reinterpret_cast<const uint4*>(src));
  const unsigned short* s16 = reinterpret_cast<const unsigned short*>(src);
  uint32_t w[4] = {0, 0, 0, 0};
#pragma unroll
  for (int q = 0; q < 8; ++q)  // unrolled: constant indices keep w in registers
    if (q < n) w[q >> 1] |= uint32_t(s16[q]) << (16 * (q & 1));
  return make_uint4(w[0], w[1], w[2], w[3]);
}
using vec::st16;  // one 16-byte store (kernels/common/vec_store.cuh)

// Stores y[0 .. min(8, n)) at o: one 16-byte store (two for fp32) when whole and aligned.
template <class TO>
__device__ __forceinline__ void store_cols(TO* o, const float (&y)[kCols], int64_t n) {
  if (n >= kCols && al16(o)) {
    if constexpr (sizeof(TO) == 4) {
      st16(o, make_float4(y[0], y[1], y[2], y[3]));
      st16(o + 4, make_float4(y[4], y[5], y[6], y[7]));
    } else {
      st16(o, make_uint4(pack2_bits<TO>(y[0], y[1]), pack2_bits<TO>(y[2], y[3]), pack2_bits<TO>(y[4], y[5]),
                         pack2_bits<TO>(y[6], y[7])));
    }
    return;
  }
#pragma unroll
  for (int q = 0; q < kCols; ++q)  // unrolled: y stays in registers
    if (q < n) o[q] = from_f<TO>(y[q]);
}

// ---------------- pairs path ----------------
// blockIdx.x = pair, blockIdx.y = s * groups + g: rank rows [g*rows, (g+1)*rows) of slice s, each
// row owned by kWarps/rows warps splitting K. u[s, p, j] = round(A_s[l,e][j] . x[row(p)]), j < rank_l.
template <class T>
__global__ void __launch_bounds__(kThreads) shrink_pairs_kernel(Common c, T* u, int rows, int groups) {
  __shared__ float part[kWarps];
  lora_dev::pdl_launch_dependents();  // the expand may start: it waits for this grid before reading u
  const int64_t p = blockIdx.x;
  const int s = int(blockIdx.y) / groups, g = int(blockIdx.y) % groups;
  const int l = slot_of(c, p);
  if (l < 0) return;
  const int r = rank_of(c, l);
  if (g * rows >= r) return;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int kp = kWarps / rows, pi = warp % kp, j = g * rows + warp / kp;
  const T* x = static_cast<const T*>(c.x) + xrow_of(c, p) * c.K;
  float acc = 0.f;
  if (j < r) {
    const T* a = wmat<T>(c.ta, s * c.E + c.topk[p], c.sa, l) + int64_t(j) * c.K;
    if (al16(a) && al16(x) && c.K % 8 == 0) {
      for (int64_t k0 = int64_t(pi * 32 + lane) * 8; k0 < c.K; k0 += int64_t(kp) * 256) {
        float xv[8], av[8];
        elem::load_vec(x + k0, xv);
        elem::load_vec(a + k0, av);
#pragma unroll
        for (int q = 0; q < 8; ++q) acc += xv[q] * av[q];
      }
    } else {
      for (int64_t k0 = pi * 32 + lane; k0 < c.K; k0 += kp * 32) acc += to_f(__ldg(x + k0)) * to_f(__ldg(a + k0));
    }
  }
  acc = lora_dev::warp_sum(acc);
  if (kp == 1) {
    if (lane == 0 && j < r) u[(int64_t(s) * c.P + p) * c.R + j] = from_f<T>(acc);
    return;
  }
  if (lane == 0) part[warp] = acc;
  __syncthreads();
  if (lane == 0 && pi == 0 && j < r) {
    float t = 0.f;
    for (int q = 0; q < kp; ++q) t += part[warp + q];
    u[(int64_t(s) * c.P + p) * c.R + j] = from_f<T>(t);
  }
}

// gemm1 expand: blockIdx.x = pair, blockIdx.y = a tile of kExpThreads*kCols columns of the pair's
// S*N-wide row. Every column is written (0 for a pair without a delta). The thread's 8 B rows are
// read 16 rank elements at a time, all 16 loads issued before their FMAs: a decode step's expand is
// a few latency-bound rounds, not one per column (4df5ced walked the columns one after another:
// Qwen T = 1 10.6 µs back to back against a 0.3 µs floor).
template <class T, class TO>
__global__ void __launch_bounds__(kExpThreads) expand_pairs_kernel(Common c, const T* u, TO* out, int64_t ld) {
  extern __shared__ float us[];  // [S][rank_l]
  const int64_t p = blockIdx.x, W = int64_t(c.S) * c.N;
  const int64_t c0 = (int64_t(blockIdx.y) * kExpThreads + threadIdx.x) * kCols;
  const int l = slot_of(c, p);
  float y[kCols];
#pragma unroll
  for (int q = 0; q < kCols; ++q) y[q] = 0.f;
  if (l >= 0) {
    const int r = rank_of(c, l), e = c.topk[p];
    const T* b[kCols];
    int so[kCols];
#pragma unroll
    for (int q = 0; q < kCols; ++q) {
      const int64_t col = c0 + q;
      const int s = col < W ? int(col / c.N) : 0;
      b[q] = col < W ? wmat<T>(c.tb, s * c.E + e, c.sb, l) + (col % c.N) * c.R : nullptr;
      so[q] = s * r;
    }
    uint4 v[2][kCols];
    auto load_b = [&](int j0) {
#pragma unroll
      for (int h = 0; h < 2; ++h)
#pragma unroll
        for (int q = 0; q < kCols; ++q) v[h][q] = load8(b[q] ? b[q] + j0 + 8 * h : nullptr, r - j0 - 8 * h);
    };
    // A programmatic dependent of the shrink: the first 16 rank elements of B (not written by it) are
    // in flight before the wait for its u. (v live across the loop's back edge: ptxas spills 4 bytes
    // with fp16 weights, 0 with bf16; loading only 8 before the wait spilled the same.)
    load_b(0);
    lora_dev::pdl_wait();
    for (int i = threadIdx.x; i < c.S * r; i += kExpThreads)
      us[i] = to_f(u[(int64_t(i / r) * c.P + p) * c.R + i % r]);
    __syncthreads();
    for (int j0 = 0; j0 < r; j0 += 16) {
      if (j0 > 0) load_b(j0);
#pragma unroll
      for (int h = 0; h < 2; ++h)
#pragma unroll
        for (int q = 0; q < kCols; ++q) {
          float f[8];
          elem::unpack<T>(v[h][q], f);
          const float* uu = us + so[q] + j0 + 8 * h;
          const int n = min(8, r - j0 - 8 * h);  // past the rank the loads are zeros; u is not read
#pragma unroll
          for (int e8 = 0; e8 < 8; ++e8)
            if (e8 < n) y[q] += uu[e8] * f[e8];
        }
    }
#pragma unroll
    for (int q = 0; q < kCols; ++q) y[q] *= c.scale;
  }
  if (c0 < W) store_cols(out + p * ld + c0, y, W - c0);
}

// gemm2 expand: blockIdx.x = token, blockIdx.y = a tile of 32 x kCols = 256 columns of H. Warp w takes
// the token's slots w, w + 8, ... (a decode step's k slots run side by side, not one after another),
// each lane 8 columns (16-byte loads of their B rows, the slot's intermediate read as a broadcast);
// the warps' sums meet in shared memory, routing-weighted, and one store per 8 columns writes the row.
constexpr int kE2Cols = 32 * kCols;
template <class T, class TO>
__global__ void __launch_bounds__(kThreads) expand2_pairs_kernel(Common c, const T* u, const float* w, TO* out,
                                                                  int64_t ld) {
  __shared__ __align__(16) float red[kWarps][kE2Cols];
  const int64_t t = blockIdx.x;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t c0 = int64_t(blockIdx.y) * kE2Cols + lane * kCols;
  lora_dev::pdl_wait();  // a programmatic dependent of the shrink (its launch overlaps the shrink)
  float y[kCols];
#pragma unroll
  for (int q = 0; q < kCols; ++q) y[q] = 0.f;
  for (int j = warp; j < c.top_k; j += kWarps) {
    const int64_t p = t * c.top_k + j;
    const int l = slot_of(c, p);
    if (l < 0) continue;
    const int r = rank_of(c, l);
    const T* B = wmat<T>(c.tb, c.topk[p], c.sb, l);
    const T* up = u + p * c.R;
    const float wt = w[p];
    // rank-outer: the slot's 8 intermediate values loaded once for the lane's 8 B rows
    float acc[kCols];
#pragma unroll
    for (int q = 0; q < kCols; ++q) acc[q] = 0.f;
    int k = 0;
    if (al16(up) && al16(B + c0 * c.R) && c.R % 8 == 0)
      for (; k + 8 <= r; k += 8) {
        float uv[8];
        elem::load_vec(up + k, uv);
#pragma unroll
        for (int q = 0; q < kCols; ++q)
          if (c0 + q < c.N) {
            float bv[8];
            elem::load_vec(B + (c0 + q) * c.R + k, bv);
#pragma unroll
            for (int e = 0; e < 8; ++e) acc[q] += uv[e] * bv[e];
          }
      }
    for (; k < r; ++k) {
      const float uk = to_f(up[k]);
#pragma unroll
      for (int q = 0; q < kCols; ++q)
        if (c0 + q < c.N) acc[q] += uk * to_f(__ldg(B + (c0 + q) * c.R + k));
    }
#pragma unroll
    for (int q = 0; q < kCols; ++q) y[q] += wt * acc[q];
  }
#pragma unroll
  for (int q = 0; q < kCols; ++q) red[warp][lane * kCols + q] = y[q];
  __syncthreads();
  if (warp != 0) return;
#pragma unroll
  for (int q = 0; q < kCols; ++q) {
    float v = 0.f;
    for (int ww = 0; ww < kWarps; ++ww) v += red[ww][lane * kCols + q];
    y[q] = c.scale * v;
  }
  if (c0 < c.N) store_cols(out + t * ld + c0, y, c.N - c0);
}

// ---------------- grouped path ----------------
// Two kernels over the alignment blocks (16-64 pairs of one adapter and expert): the shrink, grid
// (block, slot, K split), writes the fp32 intermediate u[pair, s*rp + j] (atomic partial sums with a
// K split); the expand, grid (block, slot, column split), loads its rows of u rounded to the LoRA
// dtype (FlashInfer's rank-r intermediate) and walks its share of the column tiles.
struct Grouped {
  Common c;
  int bm;                // pairs per block (the alignment's block size)
  int64_t Pp, Q;         // the alignment's P and Q
  const int32_t* sorted;
  const int32_t* eids;
  const int32_t* ntpp;
  float* u;              // [P, sr_max] fp32 intermediate
  void* out;             // gemm1: [P, ld]
  int64_t ld;
  float* acc;            // gemm2: [T, N] fp32
  const float* w;        // gemm2: routing weights [T*k]
  int sr_max;            // S * round16(R): the shared-memory plan
  int kc;                // K per shrink stage (64, 128 or 256: as many bytes in flight as 2 blocks per SM hold)
  int64_t ksz;           // K per shrink split (a multiple of 64)
  bool atomic_u;         // k_split > 1: u zeroed beforehand, partials added
  int64_t tiles_per_z;   // expand: column tiles per block
};

// Shared-memory elements of the grouped kernels' regions (host and device agree).
__host__ __device__ constexpr int64_t g_x_elems(int bm, int kc) { return int64_t(bm) * (kc + kPad); }
__host__ __device__ constexpr int64_t g_a_elems(int sr_max, int kc) { return int64_t(sr_max) * (kc + kPad); }
__host__ __device__ constexpr int64_t g_b_elems(int sr_max, int S) { return int64_t(kNT) * (sr_max / S + kPad); }
__host__ __device__ constexpr int64_t g_u_elems(int bm, int sr_max) { return int64_t(bm) * (sr_max + kPad); }
inline std::size_t shrink_smem_bytes(int bm, int sr_max, int kc, std::size_t tsize) {
  return std::size_t(2 * (g_x_elems(bm, kc) + g_a_elems(sr_max, kc))) * tsize;  // two K stages
}
inline std::size_t expand_smem_bytes(int bm, int sr_max, int S, std::size_t tsize) {
  return std::size_t(2 * g_b_elems(sr_max, S) + g_u_elems(bm, sr_max)) * tsize;  // two B buffers, the u rows
}
// The shrink's K stage: the widest of 256 / 128 / 64 whose two stages keep 2 blocks per SM (<= 110 KB
// of shared memory), no wider than the split's K rounded up to 64. Two stages: the next one's cp.async
// copies are in flight while this one's mma runs (the shrink is latency-bound, its math negligible;
// before, one synchronous stage of twice the width: ncu at ba9f6ab 0.46 issue, 25% occupancy).
inline int grouped_kc(int bm, int sr_max, int64_t K, std::size_t tsize) {
  int kc = kKCMax;
  while (kc > 64 && (shrink_smem_bytes(bm, sr_max, kc, tsize) > (std::size_t(110) << 10) || kc / 2 >= K)) kc /= 2;
  return kc;
}

__device__ __forceinline__ uint32_t ld32(const void* p) { return *reinterpret_cast<const uint32_t*>(p); }

// The live alignment block (l, b) of a grouped launch: its expert, or -1 when the block is past the
// slot's padded end or holds no valid expert. Fills pair_sh / xrow_sh (-1 for padding) for bm rows.
__device__ __forceinline__ int grouped_block(const Grouped& g, int l, int64_t b, int64_t* pair_sh, int64_t* xrow_sh) {
  const Common& c = g.c;
  if (b * g.bm >= g.ntpp[l] || b >= g.Q) return -1;
  const int e = g.eids[int64_t(l) * g.Q + b];
  if (e < 0 || e >= c.E) return -1;
  if (int(threadIdx.x) < g.bm) {
    const int32_t v = g.sorted[int64_t(l) * g.Pp + b * g.bm + threadIdx.x];
    const bool live = v >= 0 && v < c.P && (!c.perm || c.perm[v] >= 0);
    pair_sh[threadIdx.x] = live ? int64_t(v) : -1;
    if (xrow_sh) xrow_sh[threadIdx.x] = live ? xrow_of(c, v) : -1;
  }
  __syncthreads();
  return e;
}

// Shrink: u[pair, s*rp + j] (+)= X[bm, K split] . A_s^T over the true rank, fp32.
template <class T>
__global__ void __launch_bounds__(kThreads, 2) grouped_shrink_kernel(Grouped g) {
  extern __shared__ __align__(16) unsigned char smem[];
  __shared__ int64_t pair_sh[64], xrow_sh[64];
  const Common& c = g.c;
  const int l = blockIdx.y;
  const int e = grouped_block(g, l, blockIdx.x, pair_sh, xrow_sh);
  if (e < 0) return;
  const int bm = g.bm, kc = g.kc;
  const int r = rank_of(c, l), rp = (r + 15) / 16 * 16, SR = c.S * rp;
  if (SR == 0) return;
  T* sX = reinterpret_cast<T*>(smem);
  const int ldx = kc + kPad;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g8 = lane >> 2, c4 = lane & 3;
  const T* X = static_cast<const T*>(c.x);
  const int MT = bm / 16, tiles = MT * (SR / 8);
  const int64_t kb = int64_t(blockIdx.z) * g.ksz, ke = min(c.K, kb + g.ksz);
  float acc[kMaxTiles][4];
#pragma unroll
  for (int i = 0; i < kMaxTiles; ++i) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.f;
  const int qn = kc / 8;  // 16-byte pieces per staged row
  const int64_t stage_elems = g_x_elems(bm, kc) + g_a_elems(g.sr_max, kc);
  // K stage [k0, k0 + kc) into buffer b: cp.async where a piece is whole and 16-byte aligned, else a
  // load and a store (odd K or strides; zeros past K and the true rank)
  auto put = [&](T* dst, const T* src, int64_t n) {
    if (src && n >= 8 && al16(src)) lora_dev::cp_async16(lora_dev::smem_u32(dst), src, 16);
    else *reinterpret_cast<uint4*>(dst) = load8(src, n);
  };
  auto stage = [&](int64_t k0, int b) {
    T* bX = sX + b * stage_elems;
    T* bA = bX + g_x_elems(bm, kc);
    for (int i = tid; i < bm * qn; i += kThreads) {
      const int m = i / qn, q = i % qn;
      const int64_t col = k0 + q * 8;
      put(bX + m * ldx + q * 8, xrow_sh[m] >= 0 ? X + xrow_sh[m] * c.K + col : nullptr, ke - col);
    }
    for (int i = tid; i < SR * qn; i += kThreads) {
      const int ci = i / qn, q = i % qn, s = ci / rp, j = ci % rp;
      const int64_t col = k0 + q * 8;
      put(bA + ci * ldx + q * 8, j < r ? wmat<T>(c.ta, s * c.E + e, c.sa, l) + int64_t(j) * c.K + col : nullptr,
          ke - col);
    }
    lora_dev::cp_async_commit();
  };
  stage(kb, 0);
  int b = 0;
  for (int64_t k0 = kb; k0 < ke; k0 += kc, b ^= 1) {
    lora_dev::cp_async_wait<0>();
    // (this stage in place; the other buffer was last read by the previous stage's mma)
    __syncthreads();
    if (k0 + kc < ke) stage(k0 + kc, b ^ 1);
    const T* bX = sX + b * stage_elems;
    const T* bA = bX + g_x_elems(bm, kc);
    for (int kk = 0; kk < kc; kk += 16) {
#pragma unroll
      for (int i = 0; i < kMaxTiles; ++i) {
        const int t = warp + kWarps * i;
        if (t < tiles) {
          const int mt = t % MT, nt = t / MT;
          const T* ar = bX + (mt * 16 + g8) * ldx + kk + 2 * c4;
          const uint32_t af[4] = {ld32(ar), ld32(ar + 8 * ldx), ld32(ar + 8), ld32(ar + 8 * ldx + 8)};
          const T* br = bA + (nt * 8 + g8) * ldx + kk + 2 * c4;
          lora_dev::MmaOp<T>::run(acc[i], af, ld32(br), ld32(br + 8));
        }
      }
    }
  }
#pragma unroll
  for (int i = 0; i < kMaxTiles; ++i) {
    const int t = warp + kWarps * i;
    if (t < tiles) {
      const int mt = t % MT, nt = t / MT, row = mt * 16 + g8, col = nt * 8 + 2 * c4;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int64_t p = pair_sh[row + 8 * h];
        if (p < 0) continue;
        float* dst = g.u + p * g.sr_max + col;
        if (g.atomic_u) {
          atomicAdd(dst, acc[i][2 * h]);
          atomicAdd(dst + 1, acc[i][2 * h + 1]);
        } else {
          *reinterpret_cast<float2*>(dst) = make_float2(acc[i][2 * h], acc[i][2 * h + 1]);
        }
      }
    }
  }
}

// Expand: kNT-column tiles [z * tiles_per_z, ...) of Y[bm, N] = U_s[bm, rp] . B_s^T over the slices;
// the next tile's B rows are copied (cp.async) into the other of two shared B buffers while this
// tile's mma and stores run (one barrier per tile). Each warp holds one 16-row m-tile and NT =
// bm / 16 adjacent 8-column n-tiles of it (the m-tile's A fragments loaded once per k step for all
// NT) and stores its accumulators from registers (kernels/common/mma_epilogue.cuh: a quad transpose,
// then one 16-byte store per row at bm = 64), no shared-memory staging of the output.
// Per-tile work is kept to the tile's own (ncu on the H100 at ba9f6ab: this kernel issue-bound at ~54
// thread instructions per output element): the slice / column of a tile advance as counters (no
// 64-bit division per tile), a thread's B pieces sit at fixed rows of the tile when a row's pieces
// (rp / 8) divide the block (every power-of-two padded rank: no division per piece), and each row's
// output base (gemm1) or token row and weight (gemm2) is staged once per block.
template <class T, class TO, bool G2>
__global__ void __launch_bounds__(kThreads, 3) grouped_expand_kernel(Grouped g) {
  extern __shared__ __align__(16) unsigned char smem[];
  __shared__ int64_t pair_sh[64];
  __shared__ int64_t rowoff_sh[64];  // gemm1: p * ld; gemm2: (p / top_k) * N; -1: no row
  __shared__ float wt_sh[64];        // the row's scale (x its routing weight for gemm2)
  const Common& c = g.c;
  const int l = blockIdx.y;
  const int e = grouped_block(g, l, blockIdx.x, pair_sh, nullptr);
  if (e < 0) return;
  const int per_slice = int((c.N + kNT - 1) / kNT), ntiles = per_slice * c.S;
  const int t0 = int(int64_t(blockIdx.z) * g.tiles_per_z);
  const int t1 = int(min(int64_t(ntiles), int64_t(t0) + g.tiles_per_z));
  if (t0 >= t1) return;
  const int bm = g.bm;
  const int r = rank_of(c, l), rp = (r + 15) / 16 * 16, SR = c.S * rp;
  const int rp_max = g.sr_max / c.S;
  const int64_t b_elems = g_b_elems(g.sr_max, c.S);
  T* sB0 = reinterpret_cast<T*>(smem);  // two B buffers of b_elems
  T* sU = sB0 + 2 * b_elems;
  const int ldu = g.sr_max + kPad, ldb = rp_max + kPad;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g8 = lane >> 2, c4 = lane & 3;
  if (tid < bm) {  // read after the first __syncthreads of the tile loop
    const int64_t p = pair_sh[tid];
    rowoff_sh[tid] = p < 0 ? -1 : G2 ? (p / c.top_k) * c.N : p * g.ld;
    wt_sh[tid] = p < 0 ? 0.f : G2 ? c.scale * g.w[p] : c.scale;
  }
  // u rows, rounded to T (zero rows for padding; columns past the true rank are zero: A rows past it
  // were staged as zeros)
  for (int i = tid; i < bm * (SR / 2); i += kThreads) {
    const int m = i / (SR / 2), j = (i % (SR / 2)) * 2;
    const int64_t p = pair_sh[m];
    float2 v = make_float2(0.f, 0.f);
    if (p >= 0) v = *reinterpret_cast<const float2*>(g.u + p * g.sr_max + j);
    sU[m * ldu + j] = from_f<T>(v.x);
    sU[m * ldu + j + 1] = from_f<T>(v.y);
  }
  const int chunks = rp / 8;                  // 16-byte pieces per B row (up to the padded true rank)
  const int pieces = kNT * chunks;            // per tile: <= 64 x 32 = kMaxPf per thread
  // Piece i = tid + q * kThreads of a tile is row i / chunks, 16-byte piece i % chunks of it: shifts
  // where chunks is a power of two (padded ranks 16, 32, 64, 128, 256), else divided out per piece.
  // (rank 0: chunks = 0 takes the shift branch, pieces = 0 uses none; the division needs chunks >= 3)
  // (the shift and the test recomputed per piece: two instructions, no register held for them)
  auto piece = [&](int q, int& n, int& j0) {
    const int i = tid + q * kThreads;
    if ((chunks & (chunks - 1)) == 0) {
      n = i >> (__ffs(chunks) - 1), j0 = (i & (chunks - 1)) * 8;
    } else {
      n = i / chunks, j0 = (i % chunks) * 8;
    }
  };
  // A tile's B pieces go straight to shared memory: cp.async where a piece is whole and 16-byte
  // aligned (nothing held in registers across the mma: with a register prefetch of up to kMaxPf
  // pieces the kernel spilled at 3 blocks per SM), else a load and a store (odd ranks or strides).
  auto fetch = [&](int s, int64_t n0, T* dst) {
    const T* Bs = wmat<T>(c.tb, s * c.E + e, c.sb, l);
#pragma unroll
    for (int q = 0; q < kMaxPf; ++q) {
      if (tid + q * kThreads < pieces) {
        int n, j0;
        piece(q, n, j0);
        const T* src = n0 + n < c.N ? Bs + (n0 + n) * c.R + j0 : nullptr;
        T* d = dst + n * ldb + j0;
        if (src && r - j0 >= 8 && al16(src)) lora_dev::cp_async16(lora_dev::smem_u32(d), src, 16);
        else *reinterpret_cast<uint4*>(d) = load8(src, r - j0);
      }
    }
    lora_dev::cp_async_commit();
  };
  // NT = bm / 16 n-tiles per warp (kWarps / NT warps per m-tile): 1, 2 or 4, a constant per loop
  auto tiles = [&](auto nt_const) {
    constexpr int NT = decltype(nt_const)::value;
    const int wpm = kWarps / NT, mt = warp / wpm, nb = (warp % wpm) * NT;
    const int row0 = mt * 16 + g8;
    const int cw = nb * 8 + mma_epi::first_col<NT>(c4);  // the thread's first column in a tile
    // the current tile's slice and first column, advanced as counters
    int s = t0 / per_slice, nt = t0 % per_slice, buf = 0;
    fetch(s, int64_t(nt) * kNT, sB0);
    for (int tile = t0; tile < t1; ++tile) {
      const int64_t n0 = int64_t(nt) * kNT;
      const T* sB = sB0 + buf * b_elems;
      lora_dev::cp_async_wait<0>();
      // (this tile's B in place; the other buffer was last read by the previous tile's mma)
      __syncthreads();
      if (tile + 1 < t1) {  // the next tile: the next column tile of this slice, or the next slice's first
        const bool wrap = nt + 1 == per_slice;
        fetch(wrap ? s + 1 : s, int64_t(wrap ? 0 : nt + 1) * kNT, sB0 + (buf ^ 1) * b_elems);
      }
      float acc[NT][4];
#pragma unroll
      for (int i = 0; i < NT; ++i) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.f;
      for (int kk = 0; kk < rp; kk += 16) {
        const T* ar = sU + row0 * ldu + s * rp + kk + 2 * c4;
        const uint32_t af[4] = {ld32(ar), ld32(ar + 8 * ldu), ld32(ar + 8), ld32(ar + 8 * ldu + 8)};
#pragma unroll
        for (int i = 0; i < NT; ++i) {
          const T* br = sB + ((nb + i) * 8 + g8) * ldb + kk + 2 * c4;
          lora_dev::MmaOp<T>::run(acc[i], af, ld32(br), ld32(br + 8));
        }
      }
      const int64_t col = n0 + cw;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int64_t ro = rowoff_sh[row0 + 8 * h];
        const float f = wt_sh[row0 + 8 * h];
        const bool live = ro >= 0 && col < c.N;  // (every lane shuffles: tested after the gather)
        if constexpr (G2 || sizeof(TO) == 4) {
          float2 w[NT];
#pragma unroll
          for (int i = 0; i < NT; ++i) w[i] = make_float2(acc[i][2 * h] * f, acc[i][2 * h + 1] * f);
          mma_epi::gather<NT>(w, c4);
          if (live) {
            if constexpr (G2) mma_epi::add_words<NT>(g.acc + ro + col, w, c.N - col);
            else mma_epi::store_words<NT>(reinterpret_cast<float*>(g.out) + ro + int64_t(s) * c.N + col, w, c.N - col);
          }
        } else {
          uint32_t w[NT];
#pragma unroll
          for (int i = 0; i < NT; ++i) w[i] = pack2_bits<TO>(acc[i][2 * h] * f, acc[i][2 * h + 1] * f);
          mma_epi::gather<NT>(w, c4);
          if (live) mma_epi::store_words<NT>(static_cast<TO*>(g.out) + ro + int64_t(s) * c.N + col, w, c.N - col);
        }
      }
      buf ^= 1;
      if (++nt == per_slice) nt = 0, ++s;
    }
  };
  if (bm == 64) tiles(std::integral_constant<int, 4>{});
  else if (bm == 32) tiles(std::integral_constant<int, 2>{});
  else tiles(std::integral_constant<int, 1>{});
}

// gemm1 grouped path: the rows of pairs without a delta (the alignment lists only the others).
template <class TO>
__global__ void __launch_bounds__(kExpThreads) zero_inactive_kernel(Common c, TO* out, int64_t ld) {
  const int64_t W = int64_t(c.S) * c.N;
  float z[kCols];
#pragma unroll
  for (int q = 0; q < kCols; ++q) z[q] = 0.f;
  for (int64_t p = blockIdx.x; p < c.P; p += gridDim.x) {
    if (slot_of(c, p) >= 0) continue;
    for (int64_t c0 = int64_t(threadIdx.x) * kCols; c0 < W; c0 += int64_t(kExpThreads) * kCols)
      store_cols(out + p * ld + c0, z, W - c0);
  }
}

// gemm2 grouped path: out[t, :] = round(acc[t, :]) for every token.
template <class TO>
__global__ void __launch_bounds__(kExpThreads) finish_kernel(const float* acc, int64_t T, int64_t N, TO* out,
                                                             int64_t ld) {
  const int64_t t = blockIdx.x;
  if (t >= T) return;
  for (int64_t c0 = int64_t(threadIdx.x) * kCols; c0 < N; c0 += int64_t(kExpThreads) * kCols) {
    float y[kCols];
#pragma unroll
    for (int q = 0; q < kCols; ++q) y[q] = c0 + q < N ? acc[t * N + c0 + q] : 0.f;
    store_cols(out + t * ld + c0, y, N - c0);
  }
}

[[noreturn]] void bad(const char* op, const std::string& msg) { throw Error(ErrorKind::usage, std::string(op) + ": " + msg); }

// f(T{}, TO{}) with the storage types of the LoRA dtype (16-bit) and the output dtype.
template <class F> void dispatch_types(DType lora, DType out, F&& f) {
  auto with_out = [&](auto t) { elem::dispatch_dtype(out, [&](auto to) { f(t, to); }); };
  if (lora == DType::f16) with_out(__half{});
  else with_out(__nv_bfloat16{});
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Rank rows per shrink block: 8 (a warp each) while the grid has >= 2 blocks per SM, fewer (warps
// splitting K) for small batches so decode still spreads over the SMs.
int shrink_rows(int64_t pairs, int S, int rank) {
  int rows = 8;
  while (rows > 1 && pairs * S * ceil_div(rank, rows) < 264) rows /= 2;
  return rows;
}

template <class T>
void launch_shrink_pairs(const Common& c, T* u, cudaStream_t st) {
  const int rows = shrink_rows(c.P, c.S, c.R), groups = int(ceil_div(c.R, rows));
  shrink_pairs_kernel<T><<<dim3(unsigned(c.P), unsigned(c.S * groups)), kThreads, 0, st>>>(c, u, rows, groups);
  PUNICA_CUDA_CHECK_LAUNCH();
}

template <class T, class TO, bool G2>
void launch_grouped(const Grouped& g, const BgmvMoePlan& plan, int64_t T_tokens, int k, cudaStream_t st, void* ws,
                    const bgmv_detail::GroupedLayout& lay) {
  char* w = static_cast<char*>(ws);
  MoeLoraAlignArgs al;
  al.num_tokens = T_tokens;
  al.top_k = k;
  al.topk_ids = g.c.topk;
  al.token_lora_mapping = g.c.lora_ids;
  al.num_experts = g.c.E;
  al.block_size = g.bm;
  al.max_loras = g.c.L;
  al.max_padded = lay.P;
  al.sorted_token_ids = reinterpret_cast<int32_t*>(w + lay.sorted);
  al.expert_ids = reinterpret_cast<int32_t*>(w + lay.eids);
  al.num_tokens_post_pad = reinterpret_cast<int32_t*>(w + lay.ntpp);
  al.workspace = w + lay.align_ws;
  al.workspace_bytes = moe_lora_align_workspace_bytes(T_tokens, k, g.c.E, g.c.L);
  launch_moe_lora_align(al, st);
  Grouped gg = g;
  gg.sorted = al.sorted_token_ids;
  gg.eids = al.expert_ids;
  gg.ntpp = al.num_tokens_post_pad;
  gg.u = reinterpret_cast<float*>(w + lay.u);
  // the shrink: K split in multiples of 64 (16-byte pieces stay aligned), each split a whole number
  // of stages where it can
  const int ks = std::max(1, plan.k_split);
  gg.ksz = ceil_div(ceil_div(g.c.K, ks), 64) * 64;
  gg.kc = grouped_kc(g.bm, g.sr_max, gg.ksz, sizeof(T));
  gg.atomic_u = ks > 1;
  if (gg.atomic_u)
    PUNICA_CUDA_CHECK(cudaMemsetAsync(gg.u, 0, std::size_t(g.c.P) * std::size_t(g.sr_max) * 4, st));
  const unsigned zs = unsigned(ceil_div(g.c.K, gg.ksz));
  const std::size_t smem_s = shrink_smem_bytes(g.bm, g.sr_max, gg.kc, sizeof(T));
  PUNICA_CUDA_CHECK(cudaFuncSetAttribute(grouped_shrink_kernel<T>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem_s)));
  grouped_shrink_kernel<T><<<dim3(unsigned(lay.Q), unsigned(g.c.L), zs), kThreads, smem_s, st>>>(gg);
  PUNICA_CUDA_CHECK_LAUNCH();
  // the expand: the column tiles split over col_split blocks per alignment block
  const int64_t ntiles = int64_t(g.c.S) * ceil_div(g.c.N, kNT);
  gg.tiles_per_z = ceil_div(ntiles, std::max(1, plan.col_split));
  const unsigned zc = unsigned(ceil_div(ntiles, gg.tiles_per_z));
  const std::size_t smem_e = expand_smem_bytes(g.bm, g.sr_max, g.c.S, sizeof(T));
  PUNICA_CUDA_CHECK(cudaFuncSetAttribute(grouped_expand_kernel<T, TO, G2>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem_e)));
  grouped_expand_kernel<T, TO, G2><<<dim3(unsigned(lay.Q), unsigned(g.c.L), zc), kThreads, smem_e, st>>>(gg);
  PUNICA_CUDA_CHECK_LAUNCH();
}

std::size_t align_ws_bytes(int64_t T, int k, int E, int L) { return moe_lora_align_workspace_bytes(T, k, E, L); }

// The fields both ops' Common share (A: BgmvMoeGemm1Args | BgmvMoeGemm2Args).
template <class A>
Common common_of(const A& a) {
  Common c{};
  c.P = a.num_tokens * a.top_k;
  c.top_k = a.top_k; c.E = a.num_experts; c.L = a.max_loras; c.R = a.rank;
  c.ranks = a.lora_ranks; c.lora_ids = a.lora_ids; c.topk = a.topk_ids;
  c.ta = a.w_ptr_a; c.tb = a.w_ptr_b; c.sa = a.lora_stride_a; c.sb = a.lora_stride_b;
  c.scale = a.scale;
  return c;
}
// Argument errors throw; false = nothing to do (T = 0).
template <class A>
bool ready(const char* op, const std::string& err, const A& a, std::size_t need) {
  if (!err.empty()) bad(op, err);
  if (a.num_tokens == 0) return false;
  if (!a.workspace || a.workspace_bytes < need) bad(op, "workspace_bytes: expected >= " + std::to_string(need));
  return true;
}

}  // namespace

std::size_t bgmv_moe_gemm1_workspace_bytes(const BgmvMoeGemm1Args& a) {
  const BgmvMoePlan p = plan_bgmv_moe_gemm1(a);
  if (p.path == BgmvMoePath::grouped)
    return bgmv_detail::grouped_layout(a.num_tokens, a.top_k, a.num_experts, a.max_loras, p.block_m,
                                       bgmv_detail::gemm1_slices(a) * bgmv_detail::round16(a.rank)).end +
           bgmv_detail::align256(align_ws_bytes(a.num_tokens, a.top_k, a.num_experts, a.max_loras));
  return bgmv_detail::align256(std::size_t(bgmv_detail::gemm1_slices(a)) *
                               std::size_t(std::max<int64_t>(a.num_tokens * a.top_k, 1)) *
                               std::size_t(std::max(a.rank, 1)) * dtype_size(a.lora_dtype));
}
std::size_t bgmv_moe_gemm2_workspace_bytes(const BgmvMoeGemm2Args& a) {
  const BgmvMoePlan p = plan_bgmv_moe_gemm2(a);
  if (p.path == BgmvMoePath::grouped)
    return bgmv_detail::grouped_layout(a.num_tokens, a.top_k, a.num_experts, a.max_loras, p.block_m,
                                       bgmv_detail::round16(a.rank)).end +
           bgmv_detail::align256(align_ws_bytes(a.num_tokens, a.top_k, a.num_experts, a.max_loras)) +
           bgmv_detail::align256(std::size_t(std::max<int64_t>(a.num_tokens, 1)) * std::size_t(std::max<int64_t>(a.hidden, 1)) * 4);
  return bgmv_detail::align256(std::size_t(std::max<int64_t>(a.num_tokens * a.top_k, 1)) * std::size_t(std::max(a.rank, 1)) *
                               dtype_size(a.lora_dtype));
}

void launch_bgmv_moe_gemm1_lora_delta(const BgmvMoeGemm1Args& a, cudaStream_t st) {
  const char* op = "bgmv_moe_gemm1_lora_delta";
  const std::string err = bgmv_moe_gemm1_arg_error(a);
  if (!ready(op, err, a, bgmv_moe_gemm1_workspace_bytes(a))) return;
  Common c = common_of(a);
  c.S = bgmv_detail::gemm1_slices(a);
  c.K = a.hidden;
  c.N = bgmv_detail::gemm1_slice_width(a);
  c.x = a.x; c.perm = nullptr; c.scale = a.scale;
  const int64_t ld = a.ld_out ? a.ld_out : 2 * a.intermediate, W = int64_t(c.S) * c.N;
  const BgmvMoePlan plan = plan_bgmv_moe_gemm1(a);
  dispatch_types(a.lora_dtype, a.out_dtype, [&](auto tt, auto to) {
    using T = decltype(tt);
    using TO = decltype(to);
    {
      TO* out = static_cast<TO*>(a.out);
      if (plan.path == BgmvMoePath::pairs) {
        T* u = static_cast<T*>(a.workspace);
        launch_shrink_pairs<T>(c, u, st);
        const unsigned tiles = unsigned(ceil_div(W, int64_t(kExpThreads) * kCols));
        lora_dev::launch_kernel(expand_pairs_kernel<T, TO>, dim3(unsigned(c.P), tiles), dim3(kExpThreads),
                                std::size_t(c.S) * c.R * 4, st, true, c, static_cast<const T*>(u), out, ld);
        PUNICA_CUDA_CHECK_LAUNCH();
        return;
      }
      const auto lay = bgmv_detail::grouped_layout(a.num_tokens, a.top_k, a.num_experts, a.max_loras, plan.block_m,
                                                   c.S * bgmv_detail::round16(c.R));
      zero_inactive_kernel<TO><<<unsigned(std::min<int64_t>(c.P, 1056)), kExpThreads, 0, st>>>(c, out, ld);
      PUNICA_CUDA_CHECK_LAUNCH();
      Grouped g{};
      g.c = c; g.bm = plan.block_m; g.Pp = lay.P; g.Q = lay.Q; g.out = a.out; g.ld = ld;
      g.sr_max = c.S * bgmv_detail::round16(c.R);
      launch_grouped<T, TO, false>(g, plan, a.num_tokens, a.top_k, st, a.workspace, lay);
    }
  });
}

void launch_bgmv_moe_gemm2_lora_delta(const BgmvMoeGemm2Args& a, cudaStream_t st) {
  const char* op = "bgmv_moe_gemm2_lora_delta";
  const std::string err = bgmv_moe_gemm2_arg_error(a);
  if (!ready(op, err, a, bgmv_moe_gemm2_workspace_bytes(a))) return;
  Common c = common_of(a);
  c.S = 1; c.K = a.intermediate; c.N = a.hidden;
  c.x = a.act; c.perm = a.perm; c.scale = a.scale;
  const int64_t ld = a.ld_out ? a.ld_out : a.hidden;
  const BgmvMoePlan plan = plan_bgmv_moe_gemm2(a);
  dispatch_types(a.lora_dtype, a.out_dtype, [&](auto tt, auto to) {
    using T = decltype(tt);
    using TO = decltype(to);
    {
      TO* out = static_cast<TO*>(a.out);
      if (plan.path == BgmvMoePath::pairs) {
        T* u = static_cast<T*>(a.workspace);
        launch_shrink_pairs<T>(c, u, st);
        const unsigned tiles = unsigned(ceil_div(c.N, kE2Cols));
        lora_dev::launch_kernel(expand2_pairs_kernel<T, TO>, dim3(unsigned(a.num_tokens), tiles), dim3(kThreads), 0, st,
                                true, c, static_cast<const T*>(u), a.topk_weights, out, ld);
        PUNICA_CUDA_CHECK_LAUNCH();
        return;
      }
      const auto lay = bgmv_detail::grouped_layout(a.num_tokens, a.top_k, a.num_experts, a.max_loras, plan.block_m,
                                                   bgmv_detail::round16(c.R));
      float* acc = reinterpret_cast<float*>(static_cast<char*>(a.workspace) + lay.end +
                                            bgmv_detail::align256(align_ws_bytes(a.num_tokens, a.top_k, a.num_experts, a.max_loras)));
      PUNICA_CUDA_CHECK(cudaMemsetAsync(acc, 0, std::size_t(a.num_tokens) * std::size_t(a.hidden) * 4, st));
      Grouped g{};
      g.c = c; g.bm = plan.block_m; g.Pp = lay.P; g.Q = lay.Q; g.acc = acc; g.w = a.topk_weights;
      g.sr_max = bgmv_detail::round16(c.R);
      launch_grouped<T, TO, true>(g, plan, a.num_tokens, a.top_k, st, a.workspace, lay);
      finish_kernel<TO><<<unsigned(a.num_tokens), kExpThreads, 0, st>>>(acc, a.num_tokens, a.hidden, out, ld);
      PUNICA_CUDA_CHECK_LAUNCH();
    }
  });
}

}  // namespace punica::kernels
