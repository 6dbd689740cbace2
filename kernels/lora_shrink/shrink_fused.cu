// vLLM lora_shrink (add_shrink), the fused kernel family (prefill): x streamed once for every slice
// and rank column of a 64- or 128-token tile of one adapter, with three tile bodies (the 2 x 4 warp
// tile, the warp-k tile and the sm_90a wgmma tile), split-K or stream-K over the zeroed y, and the
// zero kernel that precedes them. lora_shrink.cu plans which one runs (shrink_heur, heuristics.h).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <algorithm>
#include "kernels/common/cuda_check.h"
#include "kernels/common/error.h"
#include "kernels/lora_shrink/heuristics.h"
#include "kernels/lora_shrink/lora_device.cuh"
#include "kernels/lora_shrink/lora_shrink_internal.h"
#include "kernels/lora_shrink/shrink_launch.h"
#include "kernels/lora_shrink/shrink_params.h"
#include "kernels/lora_shrink/wgmma.cuh"

namespace punica::kernels {
namespace {
using namespace lora_dev;
namespace H = shrink_heur;
using detail::num_sms_cached;

// ---------------------------------------------------------------- fused prefill
// Zero-fill of y (replaces the memset node where atomics follow). Triggers its PDL dependents at
// once: they load and multiply while this runs and wait (griddepcontrol.wait) only before their
// atomics.
__global__ void __launch_bounds__(256) shrink_zero_kernel(float* y, int64_t n) {
  pdl_launch_dependents();
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  const int64_t i0 = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if ((reinterpret_cast<uintptr_t>(y) & 15u) == 0) {
    const int64_t n4 = n / 4;
    float4* y4 = reinterpret_cast<float4*>(y);
    for (int64_t i = i0; i < n4; i += stride) y4[i] = make_float4(0.f, 0.f, 0.f, 0.f);
    for (int64_t i = 4 * n4 + i0; i < n; i += stride) y[i] = 0.f;
  } else {
    for (int64_t i = i0; i < n; i += stride) y[i] = 0.f;
  }
}

// Stores zeros into columns [c0, R) of every slice of y for the `rows` sorted tokens from `start`
// (the -1 entry's rows, and the columns past an adapter's computed groups). Whole block.
__device__ __forceinline__ void zero_tile_columns(const ShrinkParams& p, int start, int rows, int c0) {
  const int zw = p.R - c0;
  if (zw <= 0) return;
  float* Y = static_cast<float*>(p.y);
  const int per = rows * zw;
  for (int idx = threadIdx.x; idx < p.S * per; idx += blockDim.x) {
    const int s = idx / per, rem = idx - s * per, row = rem / zw, j = c0 + (rem - row * zw);
    Y[(int64_t(s) * p.T + p.meta.sorted_token_ids[start + row]) * p.R + j] = 0.f;
  }
}

// grid (tile bound, ksplit). Block = 64 tokens of one adapter entry x EVERY output column of every
// slice: the adapter's S * ceil(r/16) groups of 16 rank columns are computed in passes of
// NGP = 4 * NGW groups, so for S * r <= 64 * NGW the x tile streams from HBM once. 8 warps:
// 2 (32 tokens each) x 4 (group g of the pass goes to warp g % 4). Without split-K (gridDim.y == 1)
// the block writes every y element of its tokens (values, zeros past the true rank, zero rows for
// the -1 entry): no memset. With split-K, y was zeroed first (PDL primary) and partial sums are
// atomically added.
// BM = 128 (stream-K only: ShrinkKernel::fused128_sk, automatic's shrink_heur::auto_few_groups_sk): 4 (tokens) x 2 (column groups) warps, so each
// A stage serves twice the tokens (half the A traffic from L2 per x byte) and each stage moves
// 16 KB of x.
// One (entry, tile) of the fused kernel over k-tiles [kt0, kt1): split = partial sums added
// atomically into the zeroed y; otherwise every y element of the tile's tokens is stored.
template <class T, int NGW, int ST, int BM>
__device__ __forceinline__ void fused_tile(const ShrinkParams& p, uint8_t* smem_raw, const TileRef& tref,
                                           int64_t kt0, int64_t kt1, bool split) {
  constexpr int BK = 64, WM = BM / 32, WN = 8 / WM, NGP = WN * NGW;
  static_assert(BM == 64 || BM == 128, "64 or 128 tokens per block");
  constexpr int XI = BM * 8 / H::kFusedThreads;       // 2 x chunks per thread per stage
  constexpr int AI = NGP * 16 * 8 / H::kFusedThreads;  // NGP/2 A chunks per thread per stage
  uint4* sx = reinterpret_cast<uint4*>(smem_raw);  // [ST][BM*8]
  uint4* sa = sx + ST * BM * 8;                    // [ST][NGP*16*8]
  const int l = tref.slot, rows = tref.rows(BM), start = tref.first(BM);
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  float* Y = static_cast<float*>(p.y);
  const int S = p.S, R = p.R;
  if (l < 0) {
    if (!split) zero_tile_columns(p, start, rows, 0);
    return;
  }
  const int r = min(p.ranks[l], R);
  const int CA = (max(r, 0) + 15) >> 4;  // 16-column groups per slice with real columns
  const int NA = S * CA;
  const int nkt = int((kt1 > kt0 ? kt1 - kt0 : 0));
  const T* X = static_cast<const T*>(p.x);
  const int ch = tid & 7;
  const T* xrow[XI];
#pragma unroll
  for (int i = 0; i < XI; ++i) {
    const int row = (tid >> 3) + 32 * i;
    xrow[i] = row < rows ? X + int64_t(p.meta.sorted_token_ids[start + row]) * p.x_stride : nullptr;
  }
  const int wm = int(unsigned(warp) % WM), wn = int(unsigned(warp) / WM);
  const int g = lane >> 2, q = lane & 3;
  int tokr[2][2];
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      const int row = wm * 32 + mt * 16 + g + 8 * hh;
      tokr[mt][hh] = row < rows ? p.meta.sorted_token_ids[start + row] : -1;
    }

  // x read once (evict_first) where one pass covers every group; several passes re-read the x tile.
  const bool x_once = NA <= NGP;
  for (int g0 = 0; g0 < NA && nkt > 0; g0 += NGP) {
    const int ng = min(NGP, NA - g0);
    const T* arow[AI];
#pragma unroll
    for (int i = 0; i < AI; ++i) {
      const int ra = (tid >> 3) + 32 * i;
      const int gi = ra >> 4, rr = ra & 15;
      arow[i] = nullptr;
      if (gi < ng) {
        const int G = g0 + gi, s = G / CA, j = (G - s * CA) * 16 + rr;
        if (j < r) arow[i] = static_cast<const T*>(p.a[s]) + (int64_t(l) * R + j) * p.K;
      }
    }
    auto load_stage = [&](int stage, int64_t kt) {
      const int64_t kbase = kt * BK + ch * 8;
      uint4* dx = sx + stage * BM * 8;
      uint4* da = sa + stage * NGP * 16 * 8;
      const bool kin = kbase < p.K;
      // made here, not held across the k loop: a live 64-bit policy cost this tile's 85-register
      // build 20 bytes of spills (ptxas)
      const uint64_t xpol = x_once ? l2_evict_first_policy() : l2_evict_normal_policy();
#pragma unroll
      for (int i = 0; i < XI; ++i) {
        const int row = (tid >> 3) + 32 * i;
        const bool ok = xrow[i] != nullptr && kin;
        cp_async16(smem_u32(dx + swz(row, ch)), ok ? (const void*)(xrow[i] + kbase) : (const void*)X, ok ? 16 : 0, xpol);
      }
#pragma unroll
      for (int i = 0; i < AI; ++i) {
        const int ra = (tid >> 3) + 32 * i;
        const bool ok = arow[i] != nullptr && kin;
        cp_async16(smem_u32(da + swz(ra, ch)), ok ? (const void*)(arow[i] + kbase) : (const void*)X, ok ? 16 : 0);
      }
    };
    float acc[2][NGW][2][4] = {};

    ring_prologue<ST>(nkt, [&](int st) { load_stage(st, kt0 + st); });
    for (int it = 0; it < nkt; ++it) {
      cp_async_wait<ST - 2>();
      __syncthreads();
      const int stage = it % ST;
      const uint4* tx = sx + stage * BM * 8;
      const uint4* ta = sa + stage * NGP * 16 * 8;
#pragma unroll
      for (int kk = 0; kk < BK / 16; ++kk) {
        uint32_t af[2][4];
#pragma unroll
        for (int mt = 0; mt < 2; ++mt)
          ldmatrix_x4(af[mt], smem_u32(tx + swz(wm * 32 + mt * 16 + (lane & 15), kk * 2 + (lane >> 4))));
#pragma unroll
        for (int gw = 0; gw < NGW; ++gw) {
          const int gi = wn + WN * gw;
          if (gi < ng) {
            uint32_t bf[4];
            const int mi = lane >> 3;
            ldmatrix_x4(bf, smem_u32(ta + swz(gi * 16 + (mi >> 1) * 8 + (lane & 7), kk * 2 + (mi & 1))));
#pragma unroll
            for (int mt = 0; mt < 2; ++mt) {
              MmaOp<T>::run(acc[mt][gw][0], af[mt], bf[0], bf[1]);
              MmaOp<T>::run(acc[mt][gw][1], af[mt], bf[2], bf[3]);
            }
          }
        }
      }
      if (it + ST - 1 < nkt) load_stage((it + ST - 1) % ST, kt0 + it + ST - 1);
      cp_async_commit();
    }
    cp_async_wait<0>();
    __syncthreads();  // the next pass's prologue overwrites the stages

    if (split) pdl_wait();  // y zeroed by the primary before any atomic
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    // Split-K partials as one 16-byte atomic per lane and (mt, group, h): lanes q and q ^ 1 swap
    // half their accumulators, so the even lane holds 4 columns of row g and the odd one 4 columns
    // of row g + 8 (every 4-column piece is 16-byte aligned when R % 4 == 0 and y is). A quarter of
    // the scalar atomics' instructions; the columns past the true rank add 0. Measured on the H200
    // (bench A/B against scalar atomics, T=64 / 256 / 2048, 2 rounds, results/NOTES.md v27 part 1):
    // qkv r=64 one adapter T=256 13.58 -> 11.08 us back to back, T=2048 32 adapters 33.33 -> 28.44,
    // one slice r=64 T=2048 0.88-0.89; add_lora_linear 0.86-1.01; no case above 1.007.
    // Kept apart from the scalar loop below on purpose: one loop with a branch per (mt, h) (ccf427b,
    // reverted) measured 3-5% slower on these split-K shapes at T=256 (NOTES v28 part 3).
    if (split && (R & 3) == 0 && (reinterpret_cast<uintptr_t>(Y) & 15u) == 0) {
      const bool odd = (q & 1) != 0;
#pragma unroll
      for (int gw = 0; gw < NGW; ++gw) {
        const int gi = wn + WN * gw;
        if (gi >= ng) continue;  // warp-uniform: the shuffles below see every lane
        const int G = g0 + gi, s = G / CA, jb = (G - s * CA) * 16;
        float* Ys = Y + int64_t(s) * p.T * R;
#pragma unroll
        for (int mt = 0; mt < 2; ++mt)
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const float a0 = acc[mt][gw][h][0], a1 = acc[mt][gw][h][1], a2 = acc[mt][gw][h][2],
                        a3 = acc[mt][gw][h][3];
            const float r0 = __shfl_xor_sync(0xffffffffu, odd ? a0 : a2, 1);
            const float r1 = __shfl_xor_sync(0xffffffffu, odd ? a1 : a3, 1);
            const int tok = tokr[mt][odd ? 1 : 0];
            const int j = jb + h * 8 + 2 * (q & 2);
            if (tok < 0 || j >= r) continue;
            float v[4] = {odd ? r0 : a0, odd ? r1 : a1, odd ? a2 : r0, odd ? a3 : r1};
#pragma unroll
            for (int e = 0; e < 4; ++e) v[e] = j + e < r ? v[e] * p.scale : 0.f;
            atomicAdd(reinterpret_cast<float4*>(Ys + int64_t(tok) * R + j), make_float4(v[0], v[1], v[2], v[3]));
          }
      }
      continue;
    }
#endif
#pragma unroll
    for (int gw = 0; gw < NGW; ++gw) {
      const int gi = wn + WN * gw;
      if (gi >= ng) continue;
      const int G = g0 + gi, s = G / CA, jb = (G - s * CA) * 16;
      float* Ys = Y + int64_t(s) * p.T * R;
#pragma unroll
      for (int mt = 0; mt < 2; ++mt)
#pragma unroll
        for (int h = 0; h < 2; ++h)
#pragma unroll
          for (int c = 0; c < 4; ++c) {
            const int tok = tokr[mt][c >> 1];
            const int j = jb + h * 8 + 2 * q + (c & 1);
            if (tok < 0 || j >= R) continue;
            float* yp = Ys + int64_t(tok) * R + j;
            if (split) {
              if (j < r) atomicAdd(yp, acc[mt][gw][h][c] * p.scale);
            } else {
              *yp = j < r ? acc[mt][gw][h][c] * p.scale : 0.f;
            }
          }
    }
  }
  // Columns past the computed groups (and every column when nothing was computed): zeros.
  if (!split) zero_tile_columns(p, start, rows, nkt > 0 ? min(CA * 16, R) : 0);
}

// Warp-k tile (ShrinkKernel::fused_wk): for adapters of at most kWkGroups groups of 16 columns over
// all slices (qkv r=16, gate_up r=16, one slice r <= 64). 64 tokens x every group; the 8 warps are
// 4 (the k16 step of each 64-wide stage) x 2 (32 tokens), and every warp computes all the groups,
// so each x fragment is read from shared memory by one warp and each A fragment by two: 16 + 8 * ng
// ldmatrix per stage, against 8 * 12 in fused_tile's 2 x 4 layout (x read by 4 warps, A by 2). The
// shared-memory pipe, not DRAM, bounded fused_tile (ncu, NOTES v8: L1 70% busy at DRAM 43%, short
// scoreboard the top stall). Loads walk running pointers (no per-stage address rebuild); A rows of
// groups the adapter lacks are not loaded. The 4 k-partials are summed through shared memory once
// per tile, and y is written (or atomically added, split) in 16-byte pieces.
constexpr int kWkGroups = H::kWkMaxGroups;
constexpr int kWkLdr = H::kWkLdr;  // reduction row stride (floats): float2 stores conflict-free
template <class T, int ST>
__device__ __forceinline__ void fused_tile_wk(const ShrinkParams& p, uint8_t* smem_raw, const TileRef& tref,
                                              int64_t kt0, int64_t kt1, bool split) {
  constexpr int BM = 64, NGP = kWkGroups;
  constexpr uint32_t XB = BM * 128, AB = NGP * 16 * 128;  // bytes per stage
  static_assert(std::size_t(ST) * (XB + AB) <= H::kWkSmem && std::size_t(4) * BM * kWkLdr * 4 <= H::kWkSmem,
                "the launch's shared memory (heuristics.h) holds the stages and the k reduction");
  const uint32_t s_x = smem_u32(smem_raw), s_a = s_x + ST * XB;
  const int l = tref.slot, rows = tref.rows(BM), start = tref.first(BM);
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  if (l < 0) {
    if (!split) zero_tile_columns(p, start, rows, 0);
    return;
  }
  const int R = p.R;
  const int r = min(p.ranks[l], R);
  const int CA = (max(r, 0) + 15) >> 4;
  const int NA = min(p.S * CA, NGP);  // the host takes this tile only for S * ceil(R/16) <= NGP
  const int nkt = int(kt1 > kt0 ? kt1 - kt0 : 0);
  if (NA > 0 && nkt > 0) {
    // Loaders: thread tid copies chunk tid % 8 of x rows and A rows tid / 8 and tid / 8 + 32.
    const int ch = tid & 7, lr = tid >> 3;
    const char* X = static_cast<const char*>(p.x);
    const char* gx[2];
    const char* ga[2];
    int64_t stx[2], sta[2];  // bytes per stage: 128 for real rows, 0 for rows read as zeros
    int nx[2], na[2];
    bool la[2];
    uint32_t dx[2], da[2];
    const int64_t koff = (kt0 * 64 + ch * 8) * int64_t(sizeof(T));
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int row = lr + 32 * i;
      const bool okx = row < rows;
      gx[i] = okx ? X + (int64_t(p.meta.sorted_token_ids[start + row]) * p.x_stride) * int64_t(sizeof(T)) + koff : X;
      nx[i] = okx ? 16 : 0;
      stx[i] = okx ? 128 : 0;
      dx[i] = s_x + uint32_t(swz(row, ch)) * 16u;
      const int gi = row >> 4;  // A row `row` = row row % 16 of group gi (warp-uniform)
      la[i] = gi < NA;
      int s = 0, j = 0;
      if (la[i]) {
        s = gi / CA;
        j = (gi - s * CA) * 16 + (row & 15);
      }
      const bool oka = la[i] && j < r;
      ga[i] = oka ? static_cast<const char*>(p.a[s]) + ((int64_t(l) * R + j) * p.K) * int64_t(sizeof(T)) + koff : X;
      na[i] = oka ? 16 : 0;
      sta[i] = oka ? 128 : 0;
      da[i] = s_a + uint32_t(swz(row, ch)) * 16u;
    }
    int64_t kst = kt0 * 64;  // first k of the next stage to load
    const uint64_t xpol = l2_evict_first_policy();  // x read once (lora_device.cuh)
    auto load_stage = [&](uint32_t stage) {
      if (kst + 64 <= p.K) {  // whole stage in range (block-uniform)
#pragma unroll
        for (int i = 0; i < 2; ++i) cp_async16(dx[i] + stage * XB, gx[i], nx[i], xpol);
#pragma unroll
        for (int i = 0; i < 2; ++i)
          if (la[i]) cp_async16(da[i] + stage * AB, ga[i], na[i]);
      } else {  // last stage of a K % 64 != 0 row: chunks past K (K % 8 == 0) read as zeros, from no address past K
        const bool kin = kst + ch * 8 < p.K;
#pragma unroll
        for (int i = 0; i < 2; ++i) cp_async16(dx[i] + stage * XB, kin ? gx[i] : X, kin ? nx[i] : 0, xpol);
#pragma unroll
        for (int i = 0; i < 2; ++i)
          if (la[i]) cp_async16(da[i] + stage * AB, kin ? ga[i] : X, kin ? na[i] : 0);
      }
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        gx[i] += stx[i];
        ga[i] += sta[i];
      }
      kst += 64;
    };

    const int wk = warp & 3, wm = warp >> 2;
    const uint32_t xo = s_x + uint32_t(swz(wm * 32 + (lane & 15), wk * 2 + (lane >> 4))) * 16u;
    const int mi = lane >> 3;
    const uint32_t ao = s_a + uint32_t(swz((mi >> 1) * 8 + (lane & 7), wk * 2 + (mi & 1))) * 16u;
    float acc[2][NGP][2][4] = {};

    ring_prologue<ST>(nkt, [&](int st) { load_stage(uint32_t(st)); });
    uint32_t rd = 0, wr = ST - 1;
    for (int it = 0; it < nkt; ++it) {
      cp_async_wait<ST - 2>();
      __syncthreads();
      uint32_t af[2][4];
      ldmatrix_x4(af[0], xo + rd * XB);
      ldmatrix_x4(af[1], xo + rd * XB + 2048u);  // 16 rows on: same swizzle
#pragma unroll
      for (int g = 0; g < NGP; ++g) {
        if (g < NA) {
          uint32_t bf[4];
          ldmatrix_x4(bf, ao + rd * AB + uint32_t(g) * 2048u);
#pragma unroll
          for (int mt = 0; mt < 2; ++mt) {
            MmaOp<T>::run(acc[mt][g][0], af[mt], bf[0], bf[1]);
            MmaOp<T>::run(acc[mt][g][1], af[mt], bf[2], bf[3]);
          }
        }
      }
      if (it + ST - 1 < nkt) load_stage(wr);
      cp_async_commit();
      rd = ring_next<ST>(rd);
      wr = ring_next<ST>(wr);
    }
    cp_async_wait<0>();
    __syncthreads();  // every warp is done with the stages: the reduction reuses them

    float* red = reinterpret_cast<float*>(smem_raw);  // [4 k16 steps][64 rows][kWkLdr]
    {
      const int g8 = lane >> 2, q = lane & 3;
#pragma unroll
      for (int mt = 0; mt < 2; ++mt)
#pragma unroll
        for (int g = 0; g < NGP; ++g) {
          if (g >= NA) continue;
#pragma unroll
          for (int h = 0; h < 2; ++h)
#pragma unroll
            for (int hh = 0; hh < 2; ++hh) {
              const int row = wm * 32 + mt * 16 + g8 + 8 * hh, col = g * 16 + h * 8 + 2 * q;
              *reinterpret_cast<float2*>(red + (wk * BM + row) * kWkLdr + col) =
                  make_float2(acc[mt][g][h][2 * hh], acc[mt][g][h][2 * hh + 1]);
            }
        }
    }
    __syncthreads();
    if (split) pdl_wait();  // y zeroed by the primary before any atomic
    float* Y = static_cast<float*>(p.y);
    const bool v4 = (R & 3) == 0 && (reinterpret_cast<uintptr_t>(Y) & 15u) == 0;
    const int per_row = NA * 4;  // 4-column pieces
    for (int idx = tid; idx < rows * per_row; idx += H::kFusedThreads) {
      const int row = idx / per_row, rem = idx - row * per_row, G = rem >> 2, c4 = (rem & 3) * 4;
      float v[4];
#pragma unroll
      for (int e = 0; e < 4; ++e) v[e] = 0.f;
#pragma unroll
      for (int w = 0; w < 4; ++w) {
        const float4 t = *reinterpret_cast<const float4*>(red + (w * BM + row) * kWkLdr + G * 16 + c4);
        v[0] += t.x; v[1] += t.y; v[2] += t.z; v[3] += t.w;
      }
      const int s = G / CA, j = (G - s * CA) * 16 + c4;
      if (split && j >= r) continue;
#pragma unroll
      for (int e = 0; e < 4; ++e) v[e] = j + e < r ? v[e] * p.scale : 0.f;
      float* yp = Y + (int64_t(s) * p.T + p.meta.sorted_token_ids[start + row]) * R + j;
      if (v4) {
        if (j >= R) continue;  // R % 4 == 0: the piece is wholly in or out
        const float4 f = make_float4(v[0], v[1], v[2], v[3]);
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
        if (split) atomicAdd(reinterpret_cast<float4*>(yp), f);
        else *reinterpret_cast<float4*>(yp) = f;
#else
        if (split) {
#pragma unroll
          for (int e = 0; e < 4; ++e) atomicAdd(yp + e, v[e]);
        } else {
          *reinterpret_cast<float4*>(yp) = f;
        }
#endif
      } else {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          if (j + e >= R) break;
          if (split) atomicAdd(yp + e, v[e]);
          else yp[e] = v[e];
        }
      }
    }
  }
  if (!split) zero_tile_columns(p, start, rows, nkt > 0 ? min(CA * 16, R) : 0);
}

// wgmma tile (ShrinkKernel::fused_wg; automatic where shrink_heur::auto_wg): 128 tokens x N columns,
// N = 16 * S * ceil(R / 16) (the launch's padded groups: group G is slice G / ceil(R/16); an
// adapter's rows past its true rank are read as zeros). Warpgroup g (threads 128g..128g+127) owns
// tokens 64g..64g+63 and every column: one wgmma.m64nNk16 per k16 step with both operands in shared
// memory, so no ldmatrix, the mma runs asynchronously to the copies, and each A stage serves 128
// tokens (half the A re-reads of the 64-token tiles, NOTES v9). Stages: 128 x-rows then N A-rows of
// 128 bytes, 1024-byte aligned (the swizzle atom), written by cp.async in the swz() layout.
// ptxas (sm_90a): 82 / 89 / 96 / 177 registers for N = 32 / 48 / 64 / 192, no spills. Measured
// against the warp-k tile and kept variants: NOTES v10.
template <class T, int N, int ST>
__device__ __forceinline__ void fused_tile_wg(const ShrinkParams& p, uint8_t* smem_raw, const TileRef& tref,
                                              int64_t kt0, int64_t kt1, bool split) {
#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
  __trap();  // sm_90a only: the host takes this tile only where wgmma_available()
#else
  constexpr int BM = 128;
  constexpr uint32_t XB = BM * 128, SB = XB + N * 128;  // bytes per stage (multiples of 1024)
  static_assert(N % 16 == 0 && (N * 128) % 1024 == 0, "whole swizzle atoms");
  static_assert(std::size_t(ST) * SB + 1024 <= H::wg_smem(N), "the launch's shared memory (heuristics.h) holds the stages");
  const uint32_t s0 = (smem_u32(smem_raw) + 1023u) & ~1023u;
  const int l = tref.slot, rows = tref.rows(BM), start = tref.first(BM);
  const int tid = threadIdx.x;
  if (l < 0) {
    if (!split) zero_tile_columns(p, start, rows, 0);
    return;
  }
  const int R = p.R;
  const int r = min(p.ranks[l], R);
  const int CAm = (R + 15) >> 4;  // groups per slice of the launch (N = 16 * S * CAm)
  const int nkt = int(kt1 > kt0 ? kt1 - kt0 : 0);
  if (nkt > 0) {
    constexpr int XI = BM * 8 / H::kFusedThreads;                   // 4 x chunks per thread
    constexpr int AI = (N * 8 + H::kFusedThreads - 1) / H::kFusedThreads;  // A chunks per thread
    const int ch = tid & 7, lr = tid >> 3;
    const char* X = static_cast<const char*>(p.x);
    const int64_t koff = (kt0 * 64 + ch * 8) * int64_t(sizeof(T));
    const char* gx[XI];
    int64_t stx[XI];
    int nx[XI];
    uint32_t dx[XI];
#pragma unroll
    for (int i = 0; i < XI; ++i) {
      const int row = lr + 32 * i;
      const bool ok = row < rows;
      gx[i] = ok ? X + int64_t(p.meta.sorted_token_ids[start + row]) * p.x_stride * int64_t(sizeof(T)) + koff : X;
      nx[i] = ok ? 16 : 0;
      stx[i] = ok ? 128 : 0;
      dx[i] = uint32_t(swz(row, ch)) * 16u;
    }
    const char* ga[AI];
    int64_t sta[AI];
    int na[AI];
    uint32_t da[AI];
    bool la[AI];
#pragma unroll
    for (int i = 0; i < AI; ++i) {
      const int row = lr + 32 * i;  // A row = column `row` of the N
      la[i] = row < N;
      const int G = row >> 4, s = G / CAm, j = (G - s * CAm) * 16 + (row & 15);
      const bool ok = la[i] && s < p.S && j < r;
      ga[i] = ok ? static_cast<const char*>(p.a[s]) + ((int64_t(l) * R + j) * p.K) * int64_t(sizeof(T)) + koff : X;
      na[i] = ok ? 16 : 0;
      sta[i] = ok ? 128 : 0;
      da[i] = XB + uint32_t(swz(row, ch)) * 16u;
    }
    int64_t kst = kt0 * 64;
    const uint64_t xpol = l2_evict_first_policy();  // x read once (lora_device.cuh)
    auto load_stage = [&](uint32_t stage) {
      const uint32_t base = s0 + stage * SB;
      const bool kin = kst + ch * 8 < p.K;  // K % 8 == 0: a chunk is wholly in or out
#pragma unroll
      for (int i = 0; i < XI; ++i) cp_async16(base + dx[i], kin ? gx[i] : X, kin ? nx[i] : 0, xpol);
#pragma unroll
      for (int i = 0; i < AI; ++i)
        if (la[i]) cp_async16(base + da[i], kin ? ga[i] : X, kin ? na[i] : 0);
#pragma unroll
      for (int i = 0; i < XI; ++i) gx[i] += stx[i];
#pragma unroll
      for (int i = 0; i < AI; ++i) ga[i] += sta[i];
      kst += 64;
    };

    const int g = tid >> 7;  // warpgroup: tokens 64g..64g+63
    const uint64_t dx0 = wg::desc_k128(s0 + uint32_t(g) * 8192u), da0 = wg::desc_k128(s0 + XB);
    float acc[N / 2] = {};
    ring_prologue<ST>(nkt, [&](int st) { load_stage(uint32_t(st)); });
    uint32_t rd = 0, wr = ST - 1;
    for (int it = 0; it < nkt; ++it) {
      cp_async_wait<ST - 2>();
      wg::fence_proxy_async();
      __syncthreads();  // stage rd complete for every thread; every wgmma of stage wr (it - 1) done
      wg::fence_operands(acc);
      wg::fence();
      const uint64_t so = uint64_t((rd * SB) >> 4);
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) wg::Mma<T, N>::run(acc, dx0 + so + 2 * kk, da0 + so + 2 * kk);
      wg::commit();
      if (it + ST - 1 < nkt) load_stage(wr);  // overlaps the wgmmas
      cp_async_commit();
      wg::wait<0>();
      wg::fence_operands(acc);
      rd = ring_next<ST>(rd);
      wr = ring_next<ST>(wr);
    }
    cp_async_wait<0>();
    __syncthreads();  // the next tile's prologue overwrites the stages

    if (split) pdl_wait();
    float* Y = static_cast<float*>(p.y);
    const int w = (tid >> 5) & 3, lane = tid & 31, gq = lane >> 2, q = lane & 3;
    int tok[2];
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      const int row = 64 * g + 16 * w + gq + 8 * hh;
      tok[hh] = row < rows ? p.meta.sorted_token_ids[start + row] : -1;
    }
    // acc[4b + c]: row 16w + gq + 8 * (c >> 1) of the warpgroup's 64, column 8b + 2q + (c & 1).
    // Columns come in pairs (j even): one 8-byte store or float2 atomic per pair where R is even
    // and y 8-byte aligned (then every pair is). Measured (H200, NOTES v10): the float2 atomics
    // took the qkv layer shape from 24.3 to 20.4 us back to back (scalar atomics: 23.0).
    const bool pair = (R & 1) == 0 && (reinterpret_cast<uintptr_t>(Y) & 7u) == 0;
#pragma unroll
    for (int i = 0; i < N / 2; i += 2) {
      const int hh = (i >> 1) & 1, col = 8 * (i >> 2) + 2 * q;
      if (tok[hh] < 0) continue;
      const int G = col >> 4, s = G / CAm, j = (G - s * CAm) * 16 + (col & 15);
      if (s >= p.S || j >= R) continue;
      float* yp = Y + (int64_t(s) * p.T + tok[hh]) * R + j;
      const float v0 = j < r ? acc[i] * p.scale : 0.f, v1 = j + 1 < r ? acc[i + 1] * p.scale : 0.f;
      if (pair) {
        if (split) {
          if (j < r) atomicAdd(reinterpret_cast<float2*>(yp), make_float2(v0, v1));
        } else {
          *reinterpret_cast<float2*>(yp) = make_float2(v0, v1);
        }
        continue;
      }
      if (split) {
        if (j < r) atomicAdd(yp, v0);
        if (j + 1 < r) atomicAdd(yp + 1, v1);
      } else {
        yp[0] = v0;
        if (j + 1 < R) yp[1] = v1;
      }
    }
  }
  if (!split && nkt == 0) zero_tile_columns(p, start, rows, 0);
#endif
}

// grid (tile bound, ksplit): block (x, y) = flat tile x (the -1 entry included) over k-range y.
// stream-K (p.stream_k, grid (G, 1)): the (tile with an adapter, k-tile) iterations are cut into G
// equal contiguous ranges, one per block, G = the blocks that fit at once (one full wave, every
// block busy to the end); a range that crosses a tile boundary finishes one tile's partial sums
// (atomics into the zeroed y) and starts the next tile's. The tile count is read on the device,
// so the wave fits the real adapter sizes (the host knows only T and max_loras).
// Blocks per SM: 3 where the stages fit three times (64 tokens, one group per warp: 64 KB), so the
// registers are held to 85 there; 2 elsewhere (fused_config's `resident` assumes the same).
// WK: the warp-k tile (fused_tile_wk; NGW unused), 2 blocks per SM (its 64 accumulators).
// WGN > 0: the wgmma tile (fused_tile_wg) with N = WGN columns (BM = 128; NGW and WK unused).
template <class T, int NGW, int ST, int BM, bool WK = false, int WGN = 0>
__global__ void __launch_bounds__(H::kFusedThreads, WGN > 64 ? 1 : (BM == 64 && NGW == 1 && !WK && WGN == 0) ? 3 : 2)
    shrink_fused_kernel(ShrinkParams p) {
  extern __shared__ __align__(128) uint8_t smem_raw[];
  // add_lora_linear's expand may start (programmatic dependent) once every block of this grid has
  // started; it waits for this grid's completion before reading y.
  pdl_launch_dependents();
  const int64_t ktiles = (p.K + 63) / 64;
  // One call site of fused_tile (inlined once: two copies cost 40+ registers): the split-K grid
  // runs the loop once, a stream-K block once per tile its range touches.
  const bool sk = p.stream_k != 0;
  int64_t w = 0, w1 = 1;
  if (sk) {
    const int64_t tl = count_tiles(p.meta, p.L + 1, BM);
    const int64_t W = tl * ktiles;
    int64_t G = gridDim.x;
    // When a whole split of every tile fills >= 90% of the slots, use exactly that many blocks: the
    // ranges then fall on tile boundaries (one segment per block, no second prologue), measured
    // faster than equal ranges there (T=8192 qkv r=16, 8 adapters: 27.3 vs 30.1 us back to back).
    const int64_t ksf = G / max(int64_t(1), tl);
    if (ksf >= 1 && tl * ksf * 10 >= G * 9) G = tl * ksf;
    // at least kStreamKMinBlockIters k-tiles per block: short ranges would be all pipeline prologue
    G = min(G, max(int64_t(1), W / H::kStreamKMinBlockIters));
    if (int64_t(blockIdx.x) >= G) return;
    w = W * blockIdx.x / G;
    w1 = W * (blockIdx.x + 1) / G;
  }
  while (w < w1) {
    TileRef tref;
    int64_t k0, k1;
    if (sk) {
      const int t = int(w / ktiles);
      k0 = w - int64_t(t) * ktiles;
      k1 = min(ktiles, k0 + (w1 - w));
      if (!find_tile(p.meta, p.L + 1, BM, t, tref, false)) return;
      w += k1 - k0;
    } else {
      if (!find_tile(p.meta, p.L + 1, BM, blockIdx.x, tref, true)) return;
      k0 = int64_t(blockIdx.y) * p.ktiles_per_split;
      k1 = min(ktiles, k0 + p.ktiles_per_split);
      w = w1;
    }
    if constexpr (WGN > 0) fused_tile_wg<T, WGN, ST>(p, smem_raw, tref, k0, k1, sk || gridDim.y > 1);
    else if constexpr (WK) fused_tile_wk<T, ST>(p, smem_raw, tref, k0, k1, sk || gridDim.y > 1);
    else fused_tile<T, NGW, ST, BM>(p, smem_raw, tref, k0, k1, sk || gridDim.y > 1);
    if (w < w1) __syncthreads();  // the next tile's prologue overwrites the stages
  }
}

// ---------------------------------------------------------------- host side

template <class T, int NGW, int ST, int BM, bool WK = false, int WGN = 0>
void launch_fused_t(const ShrinkParams& p, const H::FusedConfig& c, cudaStream_t st) {
  static std::atomic<uint64_t> attr{0};  // c.smem is a function of the template arguments
  lora_dev::ensure_smem(shrink_fused_kernel<T, NGW, ST, BM, WK, WGN>, c.smem, attr);
  ShrinkParams q = p;
  q.ktiles_per_split = c.ktiles_per_split;
  q.stream_k = c.stream_k ? 1 : 0;
  // Rows of the split-K grid: the token-tile bound over every entry (the -1 entry's tiles too),
  // not ceil(T / BM) + L + 1, so that blocks which find no tile do not spill into a second wave and
  // start only when a first-wave block ends (T=2048, one adapter, 8 splits: 272 blocks on 264 slots
  // before, 256 now). Measured on the H200 (bench A/B, exp/tile-bound against 0259575, 2 rounds,
  // results/NOTES.md v27 part 4, back to back / cold): one slice r=64 T=2048 one adapter 13.83 ->
  // 12.13 us (0.88 / 0.88), H=8192 0.92 / 0.93, qkv r=16 0.88 / 0.89; the other 76 shrink cases at
  // T=16-2048 0.98-1.03 / 0.96-1.01 except mixed ranks one slice T=256 (1.07 / 1.04, not explained).
  const int64_t tiles = token_tile_bound(p.T, int64_t(p.E), BM);
  PUNICA_REQUIRE(tiles < (int64_t(1) << 31) && c.ksplit <= 65535, ErrorKind::usage, "lora_shrink: too many tokens");
  // split-K: PDL secondary of the zero kernel
  if (c.stream_k)
    launch_kernel(shrink_fused_kernel<T, NGW, ST, BM, WK, WGN>, dim3(unsigned(c.sk_blocks), 1, 1), dim3(H::kFusedThreads),
                  c.smem, st, true, q);
  else
    launch_kernel(shrink_fused_kernel<T, NGW, ST, BM, WK, WGN>, dim3(unsigned(tiles), unsigned(c.ksplit), 1),
                  dim3(H::kFusedThreads), c.smem, st, c.ksplit > 1, q);
}

template <class T>
void launch_fused(const ShrinkParams& p, const H::FusedConfig& c, cudaStream_t st) {
  if (c.wg_n > 0) {
    switch (c.wg_n) {
      case 32: return launch_fused_t<T, 1, H::wg_stages(32), 128, false, 32>(p, c, st);
      case 48: return launch_fused_t<T, 1, H::wg_stages(48), 128, false, 48>(p, c, st);
      case 64: return launch_fused_t<T, 1, H::wg_stages(64), 128, false, 64>(p, c, st);
      default: return launch_fused_t<T, 1, H::wg_stages(192), 128, false, 192>(p, c, st);
    }
  }
  if (c.wk) {
    launch_fused_t<T, 1, H::kWkStages, 64, true>(p, c, st);
    return;
  }
  if (c.bm == 128) {
    if (c.ngw == 1) launch_fused_t<T, 1, 4, 128>(p, c, st);
    else if (c.ngw == 2) launch_fused_t<T, 2, 4, 128>(p, c, st);
    else launch_fused_t<T, 3, 3, 128>(p, c, st);
    return;
  }
  if (c.ngw == 1) launch_fused_t<T, 1, 4, 64>(p, c, st);
  else if (c.ngw == 2) launch_fused_t<T, 2, 4, 64>(p, c, st);
  else launch_fused_t<T, 3, 3, 64>(p, c, st);
}

}  // namespace

namespace detail {

void launch_shrink_fused(const ShrinkParams& p, DType dtype, const shrink_heur::FusedConfig& c, cudaStream_t st) {
  if (dtype == DType::bf16) launch_fused<__nv_bfloat16>(p, c, st);
  else launch_fused<__half>(p, c, st);
}

void launch_shrink_zero(float* y, int64_t n, cudaStream_t st) {
  const int64_t blocks = std::max<int64_t>(1, std::min<int64_t>((n / 4 + 255) / 256, 4 * int64_t(num_sms_cached())));
  shrink_zero_kernel<<<unsigned(blocks), 256, 0, st>>>(y, n);
  PUNICA_CUDA_CHECK_LAUNCH();
}

}  // namespace detail
}  // namespace punica::kernels
