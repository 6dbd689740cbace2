// vLLM lora_shrink (add_shrink), the legacy kernel family: the split-K GEMV on CUDA cores (fp32
// atomics into the zeroed y, plain stores, or per-split partials for add_lora_linear's decode path)
// and the per-slice mma.sync tiles of 64 tokens of one adapter (prefill). lora_shrink.cu plans which
// one runs (shrink_heur, heuristics.h).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <algorithm>
#include "kernels/common/cuda_check.h"
#include "kernels/common/error.h"
#include "kernels/lora_shrink/heuristics.h"
#include "kernels/lora_shrink/lora_device.cuh"
#include "kernels/lora_shrink/shrink_launch.h"
#include "kernels/lora_shrink/shrink_params.h"

namespace punica::kernels {
namespace {
using namespace lora_dev;
namespace H = shrink_heur;

enum class OutMode { atomic_f32, store, partial };

// ---------------------------------------------------------------- GEMV split-K (decode)
// grid (nsplit * nrowblk, L + 1 entries, S). Warp w handles rank rows row0 + w + 8i of the block's
// k-range for kGemvTokens tokens at a time; lanes cover the range with 16-byte loads (VEC) or 8
// strided scalars (any K / alignment).
template <class T, class TO, bool VEC, OutMode MODE>
__global__ void __launch_bounds__(H::kGemvThreads) shrink_gemv_kernel(ShrinkParams p) {
  constexpr int TB = H::kGemvTokens;
  if (MODE == OutMode::partial) pdl_launch_dependents();
  if (*p.meta.no_lora_flag) return;
  const int entry = blockIdx.y;
  const int l = p.meta.active_lora_ids[entry];
  if (l < 0) return;
  const int r = p.ranks[l];
  const int ks = blockIdx.x % p.nsplit, rb = blockIdx.x / p.nsplit;
  const int row0 = rb * H::kGemvRowBlock;
  if (row0 >= r) return;
  const int row1 = min(r, row0 + H::kGemvRowBlock);
  const int s = blockIdx.z;
  const int64_t k0 = int64_t(ks) * p.kc, k1 = min(p.K, k0 + p.kc);
  const int ntok = p.meta.num_tokens_per_lora[entry];
  const int start = p.meta.lora_token_start_loc[entry];
  const T* A = static_cast<const T*>(p.a[s]) + int64_t(l) * p.R * p.K;
  const T* X = static_cast<const T*>(p.x);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;

  for (int g = 0; g < ntok; g += TB) {
    int tok[TB];
#pragma unroll
    for (int tt = 0; tt < TB; ++tt) tok[tt] = (g + tt < ntok) ? p.meta.sorted_token_ids[start + g + tt] : -1;
    for (int j0 = row0 + warp; j0 < row1; j0 += 16) {  // two rows per step for loads in flight
      float acc[2][TB];
#pragma unroll
      for (int u = 0; u < 2; ++u)
#pragma unroll
        for (int tt = 0; tt < TB; ++tt) acc[u][tt] = 0.f;
      const bool has1 = j0 + 8 < row1;
      for (int64_t kb = k0; kb < k1; kb += H::kGemvChunk) {
        float a[2][8], xv[TB][8];
        if (VEC) {
          const int64_t k = kb + lane * 8;
          const bool in = k < k1;
#pragma unroll
          for (int u = 0; u < 2; ++u) {
            if (in && (u == 0 || has1)) load8<T>(A + int64_t(j0 + 8 * u) * p.K + k, a[u]);
            else {
#pragma unroll
              for (int e = 0; e < 8; ++e) a[u][e] = 0.f;
            }
          }
#pragma unroll
          for (int tt = 0; tt < TB; ++tt) {
            if (in && tok[tt] >= 0) load8<T>(X + int64_t(tok[tt]) * p.x_stride + k, xv[tt]);
            else {
#pragma unroll
              for (int e = 0; e < 8; ++e) xv[tt][e] = 0.f;
            }
          }
        } else {
#pragma unroll
          for (int e = 0; e < 8; ++e) {
            const int64_t k = kb + lane + 32 * e;
            const bool in = k < k1;
#pragma unroll
            for (int u = 0; u < 2; ++u)
              a[u][e] = (in && (u == 0 || has1)) ? to_f<T>(A[int64_t(j0 + 8 * u) * p.K + k]) : 0.f;
#pragma unroll
            for (int tt = 0; tt < TB; ++tt)
              xv[tt][e] = (in && tok[tt] >= 0) ? to_f<T>(X[int64_t(tok[tt]) * p.x_stride + k]) : 0.f;
          }
        }
#pragma unroll
        for (int u = 0; u < 2; ++u)
#pragma unroll
          for (int tt = 0; tt < TB; ++tt)
#pragma unroll
            for (int e = 0; e < 8; ++e) acc[u][tt] = fmaf(a[u][e], xv[tt][e], acc[u][tt]);
      }
      // Butterfly sums leave every lane with every total; lane u*TB+tt writes (row u, token tt).
      float mine = 0.f;
      int mytok = -1;
#pragma unroll
      for (int u = 0; u < 2; ++u)
#pragma unroll
        for (int tt = 0; tt < TB; ++tt) {
          if (tok[tt] < 0) continue;  // warp-uniform: no reduction for absent tokens
          const float v = warp_sum(acc[u][tt]);
          if (lane == u * TB + tt) { mine = v; mytok = tok[tt]; }
        }
      if (MODE == OutMode::atomic_f32) pdl_wait();  // y zeroed by the PDL primary (no-op otherwise)
      if (lane < 2 * TB) {
        const int u = lane / TB;
        const int j = j0 + 8 * u;
        if (mytok >= 0 && j < row1) {
          const float v = mine * p.scale;
          if (MODE == OutMode::partial) {
            float* part = static_cast<float*>(p.y);
            part[((int64_t(ks) * p.S + s) * p.T + mytok) * p.R + j] = v;
          } else if (MODE == OutMode::atomic_f32) {
            atomicAdd(static_cast<float*>(p.y) + (int64_t(s) * p.T + mytok) * p.R + j, v);
          } else {
            static_cast<TO*>(p.y)[(int64_t(s) * p.T + mytok) * p.R + j] = from_f<TO>(v);
          }
        }
      }
    }
  }
}

// ---------------------------------------------------------------- mma.sync tiles (prefill)
// grid (S * nrc, flat token tiles bound, ksplit). Block = 64 tokens of one adapter x BN rank rows
// of slice s, k-range of ktiles_per_split 64-wide stages; 4 warps x 16 tokens x BN.
template <class T, int BN, bool VEC>
__global__ void __launch_bounds__(H::kMmaThreads) shrink_mma_kernel(ShrinkParams p) {
  pdl_launch_dependents();  // as in shrink_fused_kernel
  constexpr int BM = H::kMmaBM, BK = H::kMmaBK, ST = H::kMmaStages;
  extern __shared__ __align__(128) uint8_t smem_raw[];
  uint4* sx = reinterpret_cast<uint4*>(smem_raw);              // [ST][BM*8] chunks
  uint4* sa = sx + ST * BM * 8;                                 // [ST][BN*8]
  if (*p.meta.no_lora_flag) return;
  TileRef tr;
  if (!find_tile(p.meta, p.L + 1, BM, blockIdx.y, tr)) return;
  const int l = tr.slot;
  const int r = p.ranks[l];
  const int s = blockIdx.x % p.S, rc = blockIdx.x / p.S;
  const int n0 = rc * BN;
  if (n0 >= r) return;
  const int rows = tr.rows(BM);
  const int start = tr.first(BM);
  const int64_t ktiles = (p.K + BK - 1) / BK;
  const int64_t kt0 = int64_t(blockIdx.z) * p.ktiles_per_split;
  const int64_t kt1 = min(ktiles, kt0 + p.ktiles_per_split);
  if (kt0 >= kt1) return;
  const int nkt = int(kt1 - kt0);
  const T* X = static_cast<const T*>(p.x);
  const T* A = static_cast<const T*>(p.a[s]) + (int64_t(l) * p.R + n0) * p.K;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;

  // Loader assignment: x chunks (row = tid/8 + 16i, chunk = tid%8), A chunks likewise.
  constexpr int XI = BM * 8 / H::kMmaThreads;  // 4
  constexpr int AI = (BN * 8 + H::kMmaThreads - 1) / H::kMmaThreads;
  const int ch = tid & 7;
  const T* xrow[XI];
#pragma unroll
  for (int i = 0; i < XI; ++i) {
    const int row = (tid >> 3) + 16 * i;
    xrow[i] = row < rows ? X + int64_t(p.meta.sorted_token_ids[start + row]) * p.x_stride : nullptr;
  }
  const int nrows_a = min(BN, r - n0);

  auto load_stage = [&](int stage, int64_t kt) {
    const int64_t kbase = kt * BK + ch * 8;
    uint4* dx = sx + stage * BM * 8;
    uint4* da = sa + stage * BN * 8;
#pragma unroll
    for (int i = 0; i < XI; ++i) {
      const int row = (tid >> 3) + 16 * i;
      const bool ok = xrow[i] != nullptr && kbase < p.K;
      if (VEC) {
        cp_async16(smem_u32(dx + swz(row, ch)), ok ? (const void*)(xrow[i] + kbase) : (const void*)X, ok ? 16 : 0);
      } else {
        __align__(16) T v[8];
#pragma unroll
        for (int e = 0; e < 8; ++e) v[e] = (ok && kbase + e < p.K) ? xrow[i][kbase + e] : from_f<T>(0.f);
        dx[swz(row, ch)] = *reinterpret_cast<const uint4*>(v);
      }
    }
#pragma unroll
    for (int i = 0; i < AI; ++i) {
      const int row = (tid >> 3) + 16 * i;
      if (row >= BN) break;
      const bool ok = row < nrows_a && kbase < p.K;
      const T* src = A + int64_t(row) * p.K + kbase;
      if (VEC) {
        cp_async16(smem_u32(da + swz(row, ch)), ok ? (const void*)src : (const void*)A, ok ? 16 : 0);
      } else {
        __align__(16) T v[8];
#pragma unroll
        for (int e = 0; e < 8; ++e) v[e] = (ok && kbase + e < p.K) ? src[e] : from_f<T>(0.f);
        da[swz(row, ch)] = *reinterpret_cast<const uint4*>(v);
      }
    }
  };

  static_assert(BM / 16 == 4 && BK / 16 == 4, "one k16 step per warp per stage");
  float acc[BM / 16][BN / 8][4];
#pragma unroll
  for (int m = 0; m < BM / 16; ++m)
#pragma unroll
    for (int i = 0; i < BN / 8; ++i)
#pragma unroll
      for (int c = 0; c < 4; ++c) acc[m][i][c] = 0.f;

  ring_prologue<ST>(nkt, [&](int st) { load_stage(st, kt0 + st); });
  // Each warp owns the whole 64 x BN tile for k16 step `warp` of every stage (intra-block split-K):
  // B fragments are reused over 4 m-tiles, a quarter of the shared-memory reads per mma.
  for (int it = 0; it < nkt; ++it) {
    cp_async_wait<ST - 2>();
    __syncthreads();
    const int stage = it % ST;
    const uint4* tx = sx + stage * BM * 8;
    const uint4* ta = sa + stage * BN * 8;
    uint32_t bf[BN / 16][4];
#pragma unroll
    for (int pn = 0; pn < BN / 16; ++pn) {
      const int mi = lane >> 3;
      ldmatrix_x4(bf[pn], smem_u32(ta + swz(pn * 16 + (mi >> 1) * 8 + (lane & 7), warp * 2 + (mi & 1))));
    }
#pragma unroll
    for (int mt = 0; mt < BM / 16; ++mt) {
      if (mt * 16 < rows) {
        uint32_t af[4];
        ldmatrix_x4(af, smem_u32(tx + swz(mt * 16 + (lane & 15), warp * 2 + (lane >> 4))));
#pragma unroll
        for (int pn = 0; pn < BN / 16; ++pn) {
          MmaOp<T>::run(acc[mt][2 * pn], af, bf[pn][0], bf[pn][1]);
          MmaOp<T>::run(acc[mt][2 * pn + 1], af, bf[pn][2], bf[pn][3]);
        }
      }
    }
    if (it + ST - 1 < nkt) load_stage((it + ST - 1) % ST, kt0 + it + ST - 1);
    cp_async_commit();
  }
  cp_async_wait<0>();
  __syncthreads();

  // Sum the 4 warps' tiles through shared memory (reusing the pipeline buffers), then write rows.
  float* red = reinterpret_cast<float*>(smem_raw);  // [4][BM][BN+1]
  constexpr int LDR = BN + 1;
  {
    const int g = lane >> 2, q = lane & 3;
#pragma unroll
    for (int mt = 0; mt < BM / 16; ++mt)
#pragma unroll
      for (int ni = 0; ni < BN / 8; ++ni)
#pragma unroll
        for (int c = 0; c < 4; ++c) {
          const int row = mt * 16 + g + 8 * (c >> 1), col = ni * 8 + 2 * q + (c & 1);
          red[(warp * BM + row) * LDR + col] = acc[mt][ni][c];
        }
  }
  __syncthreads();
  float* Y = static_cast<float*>(p.y);
  const bool split = p.ktiles_per_split < ktiles;
  for (int idx = tid; idx < BM * BN; idx += H::kMmaThreads) {
    const int row = idx / BN, j = idx % BN;
    if (row >= rows || j >= nrows_a) continue;
    float v = 0.f;
#pragma unroll
    for (int w = 0; w < 4; ++w) v += red[(w * BM + row) * LDR + j];
    v *= p.scale;
    float* yp = Y + (int64_t(s) * p.T + p.meta.sorted_token_ids[start + row]) * p.R + n0 + j;
    if (split) atomicAdd(yp, v);
    else *yp = v;
  }
}

// ---------------------------------------------------------------- host side

template <class T, class TO, OutMode MODE>
void launch_gemv_t(const ShrinkParams& p, bool vec, const H::GemvConfig& c, cudaStream_t st,
                   bool pdl_secondary = false) {
  ShrinkParams q = p;
  q.kc = c.kc;
  q.nsplit = c.nsplit;
  q.nrowblk = c.nrowblk;
  dim3 grid(unsigned(c.nsplit * c.nrowblk), unsigned(p.E), unsigned(p.S));
  launch_kernel(vec ? shrink_gemv_kernel<T, TO, true, MODE> : shrink_gemv_kernel<T, TO, false, MODE>, grid,
                dim3(H::kGemvThreads), 0, st, pdl_secondary, q);
}

template <class T, class TO>
void launch_gemv_mode(const ShrinkParams& p, bool vec, bool atomic, const H::GemvConfig& c, cudaStream_t st,
                      bool pdl) {
  if (atomic) launch_gemv_t<T, float, OutMode::atomic_f32>(p, vec, c, st, pdl);
  else launch_gemv_t<T, TO, OutMode::store>(p, vec, c, st);
}

template <class T>
void launch_gemv_dispatch_out(const ShrinkParams& p, DType out, bool vec, const H::GemvConfig& c, cudaStream_t st,
                              bool pdl) {
  const bool atomic = out == DType::f32;
  if (out == DType::f16) launch_gemv_mode<T, __half>(p, vec, atomic, c, st, false);
  else if (out == DType::bf16) launch_gemv_mode<T, __nv_bfloat16>(p, vec, atomic, c, st, false);
  else launch_gemv_mode<T, float>(p, vec, atomic, c, st, pdl);
}

template <class T, int BN, bool VEC>
void launch_mma_bn(const ShrinkParams& p, const H::MmaConfig& c, cudaStream_t st) {
  constexpr int smem_pipe = H::kMmaStages * (H::kMmaBM + BN) * H::kMmaBK * 2;
  constexpr int smem_red = 4 * H::kMmaBM * (BN + 1) * 4;
  constexpr int smem = smem_pipe > smem_red ? smem_pipe : smem_red;
  static std::atomic<uint64_t> attr{0};
  lora_dev::ensure_smem(shrink_mma_kernel<T, BN, VEC>, smem, attr);
  ShrinkParams q = p;
  q.nrc = c.nrc;
  q.ktiles_per_split = c.ktiles_per_split;
  const int64_t tiles = (p.T + H::kMmaBM - 1) / H::kMmaBM + p.E;
  PUNICA_REQUIRE(tiles <= 65535, ErrorKind::usage, "lora_shrink: too many tokens for one launch");
  dim3 grid(unsigned(p.S * c.nrc), unsigned(tiles), unsigned(c.ksplit));
  shrink_mma_kernel<T, BN, VEC><<<grid, H::kMmaThreads, smem, st>>>(q);
  PUNICA_CUDA_CHECK_LAUNCH();
}

template <class T>
void launch_mma(const ShrinkParams& p, bool vec, const H::MmaConfig& c, cudaStream_t st) {
  if (vec) {
    if (c.bn == 16) launch_mma_bn<T, 16, true>(p, c, st);
    else if (c.bn == 32) launch_mma_bn<T, 32, true>(p, c, st);
    else launch_mma_bn<T, 64, true>(p, c, st);
  } else {
    if (c.bn == 16) launch_mma_bn<T, 16, false>(p, c, st);
    else if (c.bn == 32) launch_mma_bn<T, 32, false>(p, c, st);
    else launch_mma_bn<T, 64, false>(p, c, st);
  }
}

}  // namespace

namespace detail {

void launch_shrink_gemv(const ShrinkParams& p, DType dtype, DType out, bool vec, const shrink_heur::GemvConfig& c,
                        bool pdl, cudaStream_t st) {
  switch (dtype) {
    case DType::f32: launch_gemv_dispatch_out<float>(p, out, vec, c, st, pdl); break;
    case DType::f16: launch_gemv_dispatch_out<__half>(p, out, vec, c, st, pdl); break;
    case DType::bf16: launch_gemv_dispatch_out<__nv_bfloat16>(p, out, vec, c, st, pdl); break;
  }
}

void launch_shrink_gemv_partials(const ShrinkParams& p, DType dtype, bool vec, const shrink_heur::GemvConfig& c,
                                 cudaStream_t st) {
  switch (dtype) {
    case DType::f32: launch_gemv_t<float, float, OutMode::partial>(p, vec, c, st); break;
    case DType::f16: launch_gemv_t<__half, float, OutMode::partial>(p, vec, c, st); break;
    case DType::bf16: launch_gemv_t<__nv_bfloat16, float, OutMode::partial>(p, vec, c, st); break;
  }
}

void launch_shrink_mma(const ShrinkParams& p, DType dtype, bool vec, const shrink_heur::MmaConfig& c, cudaStream_t st) {
  if (dtype == DType::bf16) launch_mma<__nv_bfloat16>(p, vec, c, st);
  else launch_mma<__half>(p, vec, c, st);
}

}  // namespace detail
}  // namespace punica::kernels
