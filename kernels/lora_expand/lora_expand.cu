// vLLM lora_expand (add_expand): y[t, c_s + n] (+)= round_w(B_s[l] @ round_w(x[s, t, :r_l]))[n] for
// tokens with slot l. Decode (T <= 128): expand_decode.cu, and the wide-N GEMV below (lanes split a
// B row, a group of tokens shares each load; also add_lora_linear's split-K partials path).
// Prefill (expand_stream.cuh): the pipelined kernel for max_rank <= 64, 128 with an fp32 x (64 tokens of one adapter x
// several column tiles per block, the next tiles' y / B in flight while one is multiplied and
// stored; from 4096 tokens above rank 16 its dual form, tiles chosen per block by the true rank),
// the streaming kernel above that, and the staged kernel below (128 x 128 tiles, y staged through
// shared memory) for the layouts the other two exclude (rows or slice columns off 16-byte
// alignment). fp32 weights always take the decode kernels.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <algorithm>
#include <atomic>
#include <type_traits>
#include "kernels/common/cuda_check.h"
#include "kernels/common/error.h"
#include "kernels/lora_expand/expand_decode.h"
#include "kernels/lora_expand/expand_stream.cuh"
#include "kernels/lora_expand/heuristics.h"
#include "kernels/lora_expand/lora_expand.h"
#include "kernels/lora_expand/lora_expand_internal.h"
#include "kernels/lora_shrink/lora_device.cuh"
#include "kernels/lora_shrink/lora_shrink_internal.h"  // detail::num_sms_cached

namespace punica::kernels {
namespace {
using namespace lora_dev;
namespace H = expand_heur;

struct ExpandParams : ExpandCore {  // x: [S,T,R] of TI, or partials [nsplit,S,T,R] fp32
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
  TileRef tr;
  if (!find_tile(p.meta, p.L + 1, BM, blockIdx.y, tr)) return;
  const int l = tr.slot;
  const int r = p.ranks[l];
  const int rows = tr.rows(BM);
  const int start = tr.first(BM);
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
  expand_stream::add_products<T, 2, 8, 32, 64, YP>(sy, acc, wm, wn, lane, p.add);
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

// ---------------------------------------------------------------- host side

void validate(const LoraExpandArgs& a) {
  PUNICA_REQUIRE(a.num_slices >= 1 && a.num_slices <= kMaxSlices, ErrorKind::usage,
                 "lora_expand: num_slices must be in [1, 8]");
  PUNICA_REQUIRE(a.max_loras >= 0 && a.max_rank >= 0, ErrorKind::usage, "lora_expand: negative size");
  PUNICA_REQUIRE(a.max_loras + 1 <= 65535, ErrorKind::usage, "lora_expand: max_loras too large");
  PUNICA_REQUIRE(a.num_active_loras >= 0, ErrorKind::usage, "lora_expand: num_active_loras must be >= 0 (0 = not given)");
}

ExpandParams make_params(const LoraExpandArgs& a, int64_t& maxN) {
  ExpandParams p{};
  static_cast<ExpandCore&>(p) = expand_core(a);
  maxN = expand_max_width(p);
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

template <class T, class TI, bool FROM_PART>
void launch_gemv(const ExpandParams& p, int64_t maxN, bool vecb, bool pdl, cudaStream_t st) {
  dim3 grid(unsigned((maxN + H::kGemvCols - 1) / H::kGemvCols), unsigned(p.S), unsigned(p.E));
  const std::size_t smem = std::size_t(H::kGemvTokens) * ((p.R + 7) & ~7) * sizeof(float);
  PUNICA_REQUIRE(smem <= 48 * 1024, ErrorKind::usage, "lora_expand: max_rank too large");
  launch_kernel(vecb ? expand_gemv_kernel<T, TI, true, FROM_PART> : expand_gemv_kernel<T, TI, false, FROM_PART>,
                grid, dim3(H::kGemvThreads), smem, st, pdl, p);
}

using lora_dev::ensure_smem;

template <class T, class TI, int MINB>
void launch_staged(const ExpandParams& p, int64_t maxN, cudaStream_t st) {
  const int64_t tiles = (p.T + H::kStBM - 1) / H::kStBM + p.E;
  PUNICA_REQUIRE(tiles <= 65535, ErrorKind::usage, "lora_expand: too many tokens for one launch");
  dim3 grid(unsigned((maxN + H::kStBN - 1) / H::kStBN), unsigned(tiles), unsigned(p.S));
  constexpr std::size_t smem = std::size_t(H::kStBM + H::kStBN) * H::kStBK * 2 +
                               std::size_t(H::kStBM) * H::kStYPitch * sizeof(T);
  static std::atomic<uint64_t> attr{0};
  ensure_smem(expand_mma_staged_kernel<T, TI, MINB>, smem, attr);
  expand_mma_staged_kernel<T, TI, MINB><<<grid, H::kStThreads, smem, st>>>(p);
  PUNICA_CUDA_CHECK_LAUNCH();
}

expand_stream::Params stream_params(const ExpandParams& e) {
  expand_stream::Params p{};
  static_cast<ExpandCore&>(p) = e;  // the shared fields; no gathered x rows
  return p;
}

// BN-column tiles over all slices.
int64_t column_tiles(const ExpandParams& e, int bn) {
  int64_t n = 0;
  for (int s = 0; s < e.S; ++s) n += (e.n[s] + bn - 1) / bn;
  return n;
}

// How a pipelined / streaming expand kernel is launched:
// - ordinary: an ordinary launch (add_lora_embedding / add_lora_logits);
// - after_shrink: add_lora_linear's expand, a programmatic dependent of its shrink that loads y and
//   B before its griddepcontrol.wait and x after it (the streaming kernel: an ordinary launch);
// - standalone: a lora_expand call, a programmatic dependent of whatever kernel precedes it that
//   waits before any x, B or y load; only its launch and the metadata chain overlap that kernel.
enum class ExpandLaunch { ordinary, after_shrink, standalone };

// Pipelined kernel (max_rank <= RK): groups of ntb column tiles of one slice per block, ntb at most
// max_ntb and no more than one wave of resident blocks needs (small batches get one tile per block;
// the tile count is H::pipe_token_tiles' estimate, one partial tile per adapter).
// The launch of a pipelined kernel k (BM-token tiles, groups of ntb BN-column tiles, NT threads,
// smem bytes of dynamic shared memory); even: ntb rounded up to an even count (the dual kernel);
// one_wave_max, round_spill: H::pipe_ntb's longer blocks where they make one wave (0: off).
template <int BM, int BN, int NT, class K>
void launch_pipe_grid(K* k, unsigned smem, std::atomic<uint64_t>& attr, std::atomic<int>* slots_cache,
                      const ExpandParams& e, int max_ntb, bool even, cudaStream_t st, const int32_t* x_ids,
                      int64_t x_vocab, ExpandLaunch how, int one_wave_max = 0, bool round_spill = false) {
  ensure_smem(k, smem, attr);
  int dev = 0;
  PUNICA_CUDA_CHECK(cudaGetDevice(&dev));
  int slots = slots_cache[dev & 63].load(std::memory_order_relaxed);
  if (slots <= 0) {
    int sms = 0, per_sm = 0;
    PUNICA_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    PUNICA_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, k, NT, smem));
    slots = std::max(1, sms * per_sm);
    slots_cache[dev & 63].store(slots, std::memory_order_relaxed);
  }
  int64_t ct[kMaxSlices];
  for (int s = 0; s < e.S; ++s) ct[s] = (e.n[s] + BN - 1) / BN;
  int ntb = H::pipe_ntb(ct, e.S, H::pipe_token_tiles(e.T, e.E - 1, BM), slots, max_ntb, one_wave_max, round_spill);
  if (even) ntb += ntb & 1;
  int64_t gx = 0;
  for (int s = 0; s < e.S; ++s) gx += (ct[s] + ntb - 1) / ntb;
  // ceil(T / BM) + L + 1 rows, not token_tile_bound (the shrink's grid): the tighter bound measured
  // slower back to back at T=64 rank 64 (results/NOTES.md v27 part 4: one adapter 1.04-1.05, one
  // adapter in 32 slots 1.49-1.63 at unchanged cold times; not explained).
  const int64_t gy = (e.T + BM - 1) / BM + e.E;
  PUNICA_REQUIRE(gy <= 65535 && gx <= 0x7fffffff, ErrorKind::usage, "lora_expand: too many tokens for one launch");
  expand_stream::Params sp = stream_params(e);
  sp.x_ids = x_ids;
  sp.x_vocab = x_vocab;
  sp.wait_first = how == ExpandLaunch::standalone ? 1 : 0;
  launch_kernel(k, dim3(unsigned(gx), unsigned(gy)), dim3(NT), smem, st, how != ExpandLaunch::ordinary, sp, ntb);
}

template <class T, class TI, int BM, int BN, int RK, int WM, int WN, int NS, int MINB>
void launch_pipe(const ExpandParams& e, int max_ntb, cudaStream_t st, const int32_t* x_ids = nullptr,
                 int64_t x_vocab = 0, ExpandLaunch how = ExpandLaunch::ordinary, int one_wave_max = 0,
                 bool round_spill = false) {
  static std::atomic<uint64_t> attr{0};
  static std::atomic<int> slots_cache[64];
  launch_pipe_grid<BM, BN, WM * WN * 32>(expand_stream::expand_pipe_kernel<T, TI, BM, BN, RK, WM, WN, NS, MINB>,
                                         expand_stream::PipeLayout<BM, BN, RK, NS>::total, attr, slots_cache, e,
                                         max_ntb, false, st, x_ids, x_vocab, how, one_wave_max, round_spill);
}

// The dual kernel (expand_stream::expand_pipe_dual_kernel: each block's tiles chosen by its
// adapter's true rank), 64-column tile groups as the 64 x 64 kernel's, an even count per block.
template <class T, class TI>
void launch_pipe_dual(const ExpandParams& e, int max_ntb, cudaStream_t st, ExpandLaunch how) {
  static std::atomic<uint64_t> attr{0};
  static std::atomic<int> slots_cache[64];
  launch_pipe_grid<64, 64, 256>(expand_stream::expand_pipe_dual_kernel<T, TI>, expand_stream::kDualSmem, attr,
                                slots_cache, e, max_ntb, true, st, nullptr, 0, how);
}

// Streaming kernel (any rank, rank chunks of BK): one BM x BN tile per block.
template <class T, class TI, int BM, int BN, int BK, int WM, int WN, int MINB, int KS = 1>
void launch_stream(const ExpandParams& e, int64_t maxN, cudaStream_t st, ExpandLaunch how) {
  using Lay = expand_stream::Layout<BM, BN, BK, TI, KS>;
  auto* k = expand_stream::expand_stream_kernel<T, TI, BM, BN, BK, WM, WN, MINB, KS>;
  static std::atomic<uint64_t> attr{0};
  ensure_smem(k, Lay::total, attr);
  const int64_t gy = (e.T + BM - 1) / BM + e.E;
  PUNICA_REQUIRE(gy <= 65535, ErrorKind::usage, "lora_expand: too many tokens for one launch");
  expand_stream::Params sp = stream_params(e);
  const bool standalone = how == ExpandLaunch::standalone;  // else an ordinary launch
  sp.wait_first = standalone ? 1 : 0;
  launch_kernel(k, dim3(unsigned((maxN + BN - 1) / BN), unsigned(gy), unsigned(e.S)), dim3(WM * WN * 32), Lay::total,
                st, standalone, sp);
}

// The streaming / pipelined kernels' preconditions: 16-bit y with 16-byte rows and slice columns,
// 16-byte B rows and x rows (max_rank % 8 == 0 and aligned bases).
bool fast_ok(const LoraExpandArgs& a, const ExpandParams& p) {
  return a.dtype != DType::f32 && p.y16_ok && expand_b_vec_ok(a) && aligned16(a.x) && a.max_rank % 8 == 0;
}

// What the plan reads of a call (expand_heur::plan).
ExpandShape expand_shape(const LoraExpandArgs& a) {
  ExpandShape s;
  s.in_dtype = a.in_dtype;
  s.dtype = a.dtype;
  s.T = a.num_tokens;
  s.S = a.num_slices;
  s.R = a.max_rank;
  s.L = a.max_loras;
  s.planned = planned_loras(a.max_loras, a.num_active_loras);
  s.hinted = a.num_active_loras > 0;
  if (a.num_slices < 1 || a.num_slices > kMaxSlices) {
    s.has_columns = false;
    return s;
  }
  int64_t maxN = 0;
  const ExpandParams p = make_params(a, maxN);
  s.has_columns = maxN > 0;
  s.b_vec = expand_b_vec_ok(a);
  s.fast = fast_ok(a, p);
  s.col_tiles128 = column_tiles(p, 128);
  return s;
}

// Runs the plan (expand_heur::plan). pdl: add_lora_linear's expand behind its shrink
// (launch_lora_expand_after_shrink); otherwise a standalone lora_expand (ExpandLaunch). The
// instantiations stay those of the dtypes each kernel serves (fp32 x for the small-batch tiles).
template <class T, class TI>
void dispatch(const LoraExpandArgs& a, const ExpandParams& p, int64_t maxN, cudaStream_t st, const ExpandPlan& pl,
              bool pdl) {
  using P = ExpandPath;
  if constexpr (!std::is_same_v<T, float>) {
    const ExpandLaunch how = pdl ? ExpandLaunch::after_shrink : ExpandLaunch::standalone;
    if constexpr (std::is_same_v<TI, float>) {  // small batches: 32 / 16 token rows per block
      if (pl.path == P::pipe && pl.bm == 16 && pl.bk == 64)
        return launch_pipe<T, TI, 16, 128, 64, 1, 8, 3, 3>(p, pl.max_ntb, st, nullptr, 0, how);
      if (pl.path == P::pipe && pl.bm == 16)
        return launch_pipe<T, TI, 16, 128, 16, 1, 8, 2, 4>(p, pl.max_ntb, st, nullptr, 0, how, pl.one_wave_max,
                                                           pl.round_spill);
      if (pl.path == P::pipe && pl.bm == 32) return launch_pipe<T, TI, 32, 128, 16, 2, 4, 2, 4>(p, pl.max_ntb, st, nullptr, 0, how);
      if (pl.path == P::stream && pl.bm == 16)
        return pl.ks == 2 ? launch_stream<T, TI, 16, 128, 32, 1, 8, 4, 2>(p, maxN, st, how)
                          : launch_stream<T, TI, 16, 128, 32, 1, 8, 4>(p, maxN, st, how);
      if (pl.path == P::stream && pl.bm == 32)
        return pl.ks == 2 ? launch_stream<T, TI, 32, 128, 32, 2, 4, 4, 2>(p, maxN, st, how)
                          : launch_stream<T, TI, 32, 128, 32, 2, 4, 4>(p, maxN, st, how);
      if (pl.path == P::pipe_dual) return launch_pipe_dual<T, TI>(p, pl.max_ntb, st, how);
      if (pl.path == P::pipe && pl.bk == H::kPipe128MaxRank)  // ranks 65-128 (expand_heur::pipe128_ok)
        return launch_pipe<T, TI, 64, 64, H::kPipe128MaxRank, 4, 2, 3, 2>(p, pl.max_ntb, st, nullptr, 0, how,
                                                                        pl.one_wave_max);
    }
    switch (pl.path) {
      case P::pipe:
        PUNICA_REQUIRE(pl.bk <= 64, ErrorKind::runtime, "lora_expand: the rank-128 pipelined kernel takes an fp32 x");
        if (pl.bk == 16) return launch_pipe<T, TI, 64, 128, 16, 2, 4, 2, 4>(p, pl.max_ntb, st, nullptr, 0, how);
        return launch_pipe<T, TI, 64, 64, 64, 4, 2, 3, 3>(p, pl.max_ntb, st, nullptr, 0, how, pl.one_wave_max);
      case P::stream:  // two rank chunks (stream_chunks): 58 KB of shared memory, 3 blocks per SM
        return pl.ks == 2 ? launch_stream<T, TI, 64, 128, 32, 2, 4, 3, 2>(p, maxN, st, how)
                          : launch_stream<T, TI, 64, 128, 32, 2, 4, 4>(p, maxN, st, how);
      case P::staged: return launch_staged<T, TI, H::kStMinBlocks>(p, maxN, st);
      default: break;
    }
  }
  PUNICA_REQUIRE(pl.path == P::decode || pl.path == P::gemv, ErrorKind::runtime,
                 "lora_expand: the plan names a kernel this dtype has not");
  if (pl.path == P::decode) return detail::launch_expand_decode(a, st);
  launch_gemv<T, TI, false>(p, maxN, expand_b_vec_ok(a), false, st);
}

template <class T>
void dispatch_in(const LoraExpandArgs& a, const ExpandParams& p, int64_t maxN, cudaStream_t st,
                 const ExpandPlan& which, bool pdl) {
  switch (a.in_dtype) {
    case DType::f32: dispatch<T, float>(a, p, maxN, st, which, pdl); break;
    case DType::f16: dispatch<T, __half>(a, p, maxN, st, which, pdl); break;
    case DType::bf16: dispatch<T, __nv_bfloat16>(a, p, maxN, st, which, pdl); break;
  }
}

}  // namespace

namespace detail {

bool expand_pipe_ok(const LoraExpandArgs& a, const int32_t* x_ids) {
  if (a.num_slices != 1 || a.max_rank > 64 || a.max_rank < 0 || a.num_tokens <= 0 || a.max_loras <= 0 ||
      (a.num_tokens + 63) / 64 + a.max_loras + 1 > 65535)
    return false;  // the launch grid's y extent (token tiles + adapters) must fit
  if (a.lora_ranks == nullptr || (x_ids != nullptr && a.in_dtype != a.dtype)) return false;
  const LoraMetaView& m = a.meta;  // the tile lookup reads the whole adapter-level metadata
  if (!m.sorted_token_ids || !m.active_lora_ids || !m.num_tokens_per_lora || !m.lora_token_start_loc ||
      !m.no_lora_flag)
    return false;
  int64_t maxN = 0;
  const ExpandParams p = make_params(a, maxN);
  return maxN > 0 && H::use_mma(a.dtype, a.num_tokens, a.max_rank, expand_b_vec_ok(a)) && fast_ok(a, p);
}

bool launch_expand_pipe(const LoraExpandArgs& a, const int32_t* x_ids, int64_t x_vocab, cudaStream_t stream) {
  if (!expand_pipe_ok(a, x_ids)) return false;
  int64_t maxN = 0;
  const ExpandParams p = make_params(a, maxN);
  auto run = [&](auto tag, auto in_tag) {
    using T = decltype(tag);
    using TI = decltype(in_tag);
    if (a.max_rank <= 16) launch_pipe<T, TI, 64, 128, 16, 2, 4, 2, 4>(p, H::kPipeTiles16, stream, x_ids, x_vocab);
    else launch_pipe<T, TI, 64, 64, 64, 4, 2, 3, 3>(p, H::kPipeTiles64, stream, x_ids, x_vocab);
  };
  auto run_t = [&](auto tag) {
    using T = decltype(tag);
    if (a.in_dtype == DType::f32) run(T{}, float{});
    else if (a.in_dtype == a.dtype) run(T{}, T{});
    else if (a.in_dtype == DType::f16) run(T{}, __half{});
    else run(T{}, __nv_bfloat16{});
  };
  if (a.dtype == DType::bf16) run_t(__nv_bfloat16{});
  else run_t(__half{});
  return true;
}

namespace {
void launch_with(const LoraExpandArgs& a, ExpandPrefillKernel which, cudaStream_t stream, bool pdl) {
  validate(a);
  const ExpandPlan pl = plan_expand(a, which, pdl);
  if (pl.path == ExpandPath::none) return;
  int64_t maxN = 0;
  const ExpandParams p = make_params(a, maxN);
  switch (a.dtype) {
    case DType::f32: dispatch_in<float>(a, p, maxN, stream, pl, pdl); break;
    case DType::f16: dispatch_in<__half>(a, p, maxN, stream, pl, pdl); break;
    case DType::bf16: dispatch_in<__nv_bfloat16>(a, p, maxN, stream, pl, pdl); break;
  }
}
}  // namespace


void launch_lora_expand_after_shrink(const LoraExpandArgs& a, cudaStream_t stream) {
  launch_with(a, ExpandPrefillKernel::automatic, stream, true);
}

ExpandPrefillKernel expand_prefill_kernel(const LoraExpandArgs& a, ExpandPrefillKernel which, bool after_shrink) {
  return H::choose_prefill(expand_shape(a), which, after_shrink).kind;
}

ExpandPlan plan_expand(const LoraExpandArgs& a, ExpandPrefillKernel which, bool after_shrink) {
  return H::plan(expand_shape(a), which, after_shrink, num_sms_cached());
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
  const bool vecb = expand_b_vec_ok(a);
  switch (a.dtype) {
    case DType::f32: launch_gemv<float, float, true>(p, maxN, vecb, true, stream); break;
    case DType::f16: launch_gemv<__half, float, true>(p, maxN, vecb, true, stream); break;
    case DType::bf16: launch_gemv<__nv_bfloat16, float, true>(p, maxN, vecb, true, stream); break;
  }
}

}  // namespace detail

ExpandPlan lora_expand_plan(const LoraExpandArgs& a, ExpandPrefillKernel which) {
  return detail::plan_expand(a, which, false);
}

std::string plan_name(const ExpandPlan& p) {
  const auto n = [](int v) { return std::to_string(v); };
  switch (p.path) {
    case ExpandPath::none: return "none";
    case ExpandPath::decode: return "decode";
    case ExpandPath::gemv: return "gemv";
    case ExpandPath::staged: return "staged";
    case ExpandPath::stream: return "stream/bm" + n(p.bm) + (p.ks == 2 ? "/ks2" : "");
    case ExpandPath::pipe: return "pipe/bm" + n(p.bm) + "/bn" + n(p.bn) + "/bk" + n(p.bk);
    case ExpandPath::pipe_dual: return "pipe_dual/bm64";
  }
  return "?";
}

std::string describe_lora_expand_plan(const LoraExpandArgs& a, ExpandPrefillKernel which) {
  return plan_name(lora_expand_plan(a, which));
}

void launch_lora_expand_with(const LoraExpandArgs& a, ExpandPrefillKernel which, cudaStream_t stream) {
  detail::launch_with(a, which, stream, false);
}

void launch_lora_expand(const LoraExpandArgs& a, cudaStream_t stream) {
  launch_lora_expand_with(a, ExpandPrefillKernel::automatic, stream);
}

}  // namespace punica::kernels
