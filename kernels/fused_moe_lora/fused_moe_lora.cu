// add_lora_fused_moe on the device (SPEC §4.3, A.6). One kernel per (work tile, slice): a tile is
// one block of the aligned path (<= block_size pairs sharing (slot, expert)) or one pair of the
// naive path. The tile's pairs go through in chunks of kChunk: the shrink (a warp per rank row,
// 16-byte loads along K, the chunk's x rows against one A row) leaves round_I(A.x) in shared
// memory, the expand (a thread per output column, 16-byte loads of its B row) adds the delta.
// Work is proportional to each adapter's true rank: A rows / B columns beyond it are never read.
// The split form runs the same kernel as shrink-only and expand-only through a global buffer.
// The aligned path's split form (what the one call runs with scratch) has tensor-core kernels too
// (heuristics.h picks): a block of 16 pairs of one (slot, expert) per mma.sync m16n8k16 tile, the
// work items (slot entry, alignment block) packed densely so no block waits on an empty one. The one
// call's mma shrink splits K over blocks (fp32 parts in its scratch, the item's last block rounds).
#include "kernels/fused_moe_lora/fused_moe_lora.h"
#include "kernels/fused_moe_lora/heuristics.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <string>
#include <type_traits>

#include "kernels/common/cuda_check.h"
#include "kernels/common/error.h"
#include "kernels/common/mma_epilogue.cuh"
#include "kernels/common/vec_store.cuh"

namespace punica::kernels {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kChunk = 16;  // pairs per shrink/expand pass (accumulators per thread)

enum Mode : int { kFused = 0, kShrinkOnly = 1, kExpandOnly = 2 };

struct Params {
  int64_t numel;  // M * k
  int top_k;
  int64_t K;
  const void* x;
  int64_t ldx;
  bool mul;
  const float* w;
  const void* A[kMaxSlices];
  const void* B[kMaxSlices];
  int64_t a_lora_stride, a_expert_stride, b_lora_stride, b_expert_stride;  // elements
  int E;
  int64_t N;
  int L;
  int rA, rB, a_off;
  const int32_t* ranks;
  const int32_t* map;
  const int32_t* enabled;
  bool naive;
  int bs;
  int64_t P, Q;
  const int32_t* sorted;
  const int32_t* eids;
  const int32_t* ntpp;
  const int32_t* lora_ids;
  void* y;
  int64_t ldy, offset;
  bool add;
  void* inter;
  bool vec_k, vec_b;
  int S;
  int nz;         // blockIdx.z = s * nz + t: t is a column tile (expand) or a rank-row group (shrink-only)
  int64_t tn;     // expand columns per tile (mma expand: 128-column tiles per block)
  int rows;       // shrink-only: A rows per row group
  int kparts;     // shrink-only: warps per A row (K split; rows * kparts == kWarps when > 1)
  int nent;       // aligned path: slot entries (L + 1 with lora_ids, else L)
  int64_t wmax;   // mma kernels: work-item slots of the grid (a grid-stride loop covers the rest)
  int group;      // mma expand: consecutive work items per block (1: the one-item kernel)
  bool vec_y;     // 16-byte y accesses: the written columns start 8-aligned in 16-byte-aligned rows
  int ksplit;     // mma shrink: K parts per work item (blockIdx.y); > 1 with the one call's scratch
  float* part;    // split-K: [ksplit][S][numel][rA] fp32 part sums (scratch)
  int* ticket;    // split-K: [S][gridDim.x] arrival counters, zeroed before the launch (scratch)
};

template <class T> __device__ __forceinline__ float tof(T v);
template <> __device__ __forceinline__ float tof<__half>(__half v) { return __half2float(v); }
template <> __device__ __forceinline__ float tof<__nv_bfloat16>(__nv_bfloat16 v) { return __bfloat162float(v); }
template <> __device__ __forceinline__ float tof<float>(float v) { return v; }
template <class T> __device__ __forceinline__ T fromf(float v);
template <> __device__ __forceinline__ __half fromf<__half>(float v) { return __float2half_rn(v); }
template <> __device__ __forceinline__ __nv_bfloat16 fromf<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }
template <> __device__ __forceinline__ float fromf<float>(float v) { return v; }
template <class T> __device__ __forceinline__ float round_as(float v) { return tof<T>(fromf<T>(v)); }

template <class T> __device__ __forceinline__ void load8(const T* p, float out[8]) {
  const uint4 v = __ldg(reinterpret_cast<const uint4*>(p));
  const T* e = reinterpret_cast<const T*>(&v);
#pragma unroll
  for (int i = 0; i < 8; ++i) out[i] = tof<T>(e[i]);
}

// Programmatic dependent launch (sm_90): the one call's expand is a dependent of its shrink, so its
// launch, routing reads and (mma) B loads overlap the shrink; it waits before reading the
// intermediate. Without the launch attribute the wait returns at once (the split API's expand).
__device__ __forceinline__ void wait_for_shrink() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

template <class T, class TI, int MODE>
__global__ void __launch_bounds__(kThreads) fused_moe_lora_kernel(Params p) {
  extern __shared__ float u_sh[];  // [kChunk][max(rA, rB)]
  __shared__ int pairs_sh[kMoeLoraMaxBlockSize];
  __shared__ int64_t xoff_sh[kChunk];
  __shared__ int npairs_sh;
  __shared__ float red_sh[kWarps][kChunk];  // shrink-only K split: per-warp partial sums
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  // the one call's expand may launch now: at decode its blocks find free SMs beside this grid
  if (MODE == kShrinkOnly) asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
  const int s = int(blockIdx.z) / p.nz, t = int(blockIdx.z) % p.nz;
  int l, e;
  if (p.naive) {
    const int64_t i = blockIdx.x;
    l = p.map[i / p.top_k];
    if (l < 0 || l >= p.L || (p.enabled && p.enabled[l] == 0)) return;
    e = p.eids[i];
    if (e < 0 || e >= p.E) return;
    if (threadIdx.x == 0) { pairs_sh[0] = int(i); npairs_sh = 1; }
  } else {
    const int entry = blockIdx.y;
    l = p.lora_ids ? p.lora_ids[entry] : entry;
    if (l < 0 || l >= p.L || (p.enabled && p.enabled[l] == 0)) return;
    const int64_t b = blockIdx.x;
    const int64_t start = b * p.bs;
    if (start >= p.ntpp[l] || b >= p.Q) return;
    e = p.eids[int64_t(l) * p.Q + b];
    if (e < 0 || e >= p.E) return;
    if (threadIdx.x == 0) npairs_sh = 0;
    __syncthreads();
    const int32_t* list = p.sorted + int64_t(l) * p.P + start;
    for (int q = threadIdx.x; q < p.bs && start + q < p.P; q += kThreads) {
      const int32_t v = list[q];
      if (v >= 0 && v < p.numel) pairs_sh[atomicAdd(&npairs_sh, 1)] = v;
    }
  }
  __syncthreads();
  const int npairs = npairs_sh;
  const int rank_l = p.ranks ? p.ranks[l] : p.rB;
  const int rl_b = max(0, min(rank_l, p.rB));  // true rank in B's rank dim
  const int rw = p.rA > p.rB ? p.rA : p.rB;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const T* x = static_cast<const T*>(p.x);
  for (int c0 = 0; c0 < npairs; c0 += kChunk) {
    const int cn = min(kChunk, npairs - c0);
    if (MODE != kExpandOnly) {
      // ---- shrink: u[q][j] = round_I(A[l,e][j] . x[row(pair q)]) over the local true rank
      if (threadIdx.x < cn) {
        const int64_t pr = pairs_sh[c0 + threadIdx.x];
        xoff_sh[threadIdx.x] = (p.mul ? pr : pr / p.top_k) * p.ldx;
      }
      __syncthreads();
      const T* A = static_cast<const T*>(p.A[s]) + int64_t(l) * p.a_lora_stride + int64_t(e) * p.a_expert_stride;
      const int rl_loc = max(0, min(rank_l - p.a_off, p.rA));
      // shrink-only splits A's rows over t; the fused form recomputes all of them in every tile
      const int j0 = MODE == kShrinkOnly ? t * p.rows : 0;
      const int j1 = MODE == kShrinkOnly ? min(p.rA, j0 + p.rows) : p.rA;
      const int kp = MODE == kShrinkOnly ? p.kparts : 1, part = warp % kp;
      for (int j = j0 + warp / kp; j < j1; j += kWarps / kp) {
        float acc[kChunk];
#pragma unroll
        for (int q = 0; q < kChunk; ++q) acc[q] = 0.f;
        if (j < rl_loc) {
          const T* arow = A + int64_t(j) * p.K;
          if (p.vec_k) {
            for (int64_t kk = (int64_t(part) * 32 + lane) * 8; kk < p.K; kk += int64_t(256) * kp) {
              float a8[8];
              load8(arow + kk, a8);
#pragma unroll
              for (int q = 0; q < kChunk; ++q) {
                if (q < cn) {
                  float x8[8];
                  load8(x + xoff_sh[q] + kk, x8);
#pragma unroll
                  for (int t = 0; t < 8; ++t) acc[q] = fmaf(a8[t], x8[t], acc[q]);
                }
              }
            }
          } else {
            for (int64_t kk = int64_t(part) * 32 + lane; kk < p.K; kk += int64_t(32) * kp) {
              const float av = tof<T>(arow[kk]);
#pragma unroll
              for (int q = 0; q < kChunk; ++q)
                if (q < cn) acc[q] = fmaf(av, tof<T>(x[xoff_sh[q] + kk]), acc[q]);
            }
          }
#pragma unroll
          for (int q = 0; q < kChunk; ++q) {
            if (q < cn) {
#pragma unroll
              for (int o = 16; o > 0; o >>= 1) acc[q] += __shfl_xor_sync(0xffffffffu, acc[q], o);
            }
          }
        }
        if (lane < cn) {
          float v = 0.f;
#pragma unroll
          for (int q = 0; q < kChunk; ++q)
            if (q == lane) v = acc[q];
          if (MODE == kShrinkOnly && kp > 1) {
            red_sh[warp][lane] = v;
          } else if (MODE == kShrinkOnly) {
            const int64_t pr = pairs_sh[c0 + lane];
            static_cast<TI*>(p.inter)[(int64_t(s) * p.numel + pr) * p.rA + j] = fromf<TI>(v);
          } else {
            u_sh[lane * rw + j] = round_as<TI>(v);
          }
        }
      }
      if (MODE == kShrinkOnly && kp > 1) {
        // each warp had at most one row (rows * kp == kWarps); part 0 adds the parts in order
        __syncthreads();
        const int j = j0 + warp / kp;
        if (part == 0 && j < j1 && lane < cn) {
          float v = 0.f;
          for (int q = 0; q < kp; ++q) v += red_sh[warp + q][lane];
          const int64_t pr = pairs_sh[c0 + lane];
          static_cast<TI*>(p.inter)[(int64_t(s) * p.numel + pr) * p.rA + j] = fromf<TI>(v);
        }
      }
    } else {
      // ---- expand-only: the chunk's intermediate rows from the (collective's) buffer
      wait_for_shrink();
      const TI* u = static_cast<const TI*>(p.inter);
      for (int idx = threadIdx.x; idx < cn * rl_b; idx += kThreads) {
        const int q = idx / rl_b, j = idx % rl_b;
        u_sh[q * rw + j] = tof<TI>(u[(int64_t(s) * p.numel + pairs_sh[c0 + q]) * p.rB + j]);
      }
    }
    __syncthreads();
    if (MODE != kShrinkOnly) {
      // ---- expand: y[pair, offset + s*N + n] (+)= round(w * B[l,e][n] . u)
      const T* Bm = static_cast<const T*>(p.B[s]) + int64_t(l) * p.b_lora_stride + int64_t(e) * p.b_expert_stride;
      T* y = static_cast<T*>(p.y);
      const int rl = rl_b;
      const int64_t n0 = int64_t(t) * p.tn, n1 = n0 + p.tn < p.N ? n0 + p.tn : p.N;
      for (int64_t n = n0 + threadIdx.x; n < n1; n += kThreads) {
        float acc[kChunk];
#pragma unroll
        for (int q = 0; q < kChunk; ++q) acc[q] = 0.f;
        const T* brow = Bm + n * p.rB;
        int j = 0;
        if (p.vec_b) {
          for (; j + 8 <= rl; j += 8) {
            float b8[8];
            load8(brow + j, b8);
#pragma unroll
            for (int q = 0; q < kChunk; ++q) {
              if (q < cn) {
#pragma unroll
                for (int t = 0; t < 8; ++t) acc[q] = fmaf(u_sh[q * rw + j + t], b8[t], acc[q]);
              }
            }
          }
        }
        for (; j < rl; ++j) {
          const float bv = tof<T>(brow[j]);
#pragma unroll
          for (int q = 0; q < kChunk; ++q)
            if (q < cn) acc[q] = fmaf(u_sh[q * rw + j], bv, acc[q]);
        }
#pragma unroll
        for (int q = 0; q < kChunk; ++q) {
          if (q < cn) {
            const int64_t pr = pairs_sh[c0 + q];
            float d = acc[q];
            if (p.mul) d *= p.w[pr];
            T* yp = y + pr * p.ldy + p.offset + int64_t(s) * p.N + n;
            const float prev = p.add ? tof<T>(*yp) : 0.f;
            *yp = fromf<T>(prev + round_as<T>(d));
          }
        }
      }
    }
    __syncthreads();
  }
}

// ---- Tensor-core kernels (aligned or naive routing, split form) ----
// A work item is one alignment block (<= block_size pairs of one slot and expert) or one naive pair;
// its pairs go through 16 at a time as the m16 rows of mma.sync m16n8k16 tiles. The k dimension
// (K for the shrink, the rank for the expand) is permuted alike in both operands so every thread
// loads 8 or 16 contiguous bytes: a sum over k does not care about its order.
constexpr int kMmaThreads = 128;  // 4 warps
constexpr int kMmaWarps = kMmaThreads / 32;
constexpr int kMmaRows = int(moe_heur::kMmaRows);  // pairs per tile
constexpr int kExpandCols = moe_heur::kExpandCols;  // expand: columns per tile (a warp: 4 n8 tiles)
static_assert(kMmaThreads >= moe_heur::kMmaMaxEntries && kExpandCols == 32 * kMmaWarps, "tile shape");

template <class T>
__device__ __forceinline__ void mma16816(float c[4], const uint32_t a[4], const uint32_t b[2]) {
#ifdef PUNICA_BLOCK_EMU
  ::emu::mma16816<T>(c, a, b);
#else
  if constexpr (std::is_same<T, __half>::value)
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  else
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#endif
}

template <class T> __device__ __forceinline__ float bits_to_f(uint32_t b) {
  const unsigned short u = static_cast<unsigned short>(b);
  T h;
  memcpy(&h, &u, 2);
  return tof<T>(h);
}
template <class T> __device__ __forceinline__ uint32_t f_to_bits(float v) {
  const T h = fromf<T>(v);
  unsigned short u;
  memcpy(&u, &h, 2);
  return u;
}

__device__ __forceinline__ uint4 ldg16(const void* p) { return __ldg(reinterpret_cast<const uint4*>(p)); }

// Elements [j, j + 4) of a 16-bit row (j % 4 == 0, 8-byte aligned there), zero from `lim` on: the
// rank padding past an adapter's true rank is never read.
__device__ __forceinline__ uint2 ld4_masked(const void* row, int j, int lim) {
  uint2 r;
  r.x = 0u;
  r.y = 0u;
  const unsigned short* q = static_cast<const unsigned short*>(row);
  if (j + 4 <= lim) return __ldg(reinterpret_cast<const uint2*>(q + j));
  if (j < lim) {  // a rank not a multiple of 4: j, j + 1, j + 2 below lim at most
    r.x = __ldg(q + j);
    if (j + 1 < lim) r.x |= uint32_t(__ldg(q + j + 1)) << 16;
    if (j + 2 < lim) r.y = __ldg(q + j + 2);
  }
  return r;
}

// The packed work list: aligned, slot entry i holds min(Q, ceil(ntpp[l] / bs)) blocks (0 when the
// slot is skipped) and an inclusive prefix over the entries in shared memory maps a work index to
// (slot, block); naive, work index = pair. Returns the item count. Needs nent <= kMmaThreads.
__device__ __forceinline__ int64_t work_prefix(const Params& p, int* pre, int* slot) {
  if (p.naive) return p.numel;
  const int i = threadIdx.x;
  int nb = 0, l = -1;
  if (i < p.nent) {
    l = p.lora_ids ? p.lora_ids[i] : i;
    if (l >= 0 && l < p.L && !(p.enabled && p.enabled[l] == 0)) {
      const int64_t n = (int64_t(p.ntpp[l]) + p.bs - 1) / p.bs;
      nb = int(n < 0 ? 0 : (n < p.Q ? n : p.Q));
    }
  }
  slot[i] = l;
  pre[i] = nb;
  __syncthreads();
  for (int o = 1; o < kMmaThreads; o <<= 1) {
    const int v = i >= o ? pre[i - o] : 0;
    __syncthreads();
    pre[i] += v;
    __syncthreads();
  }
  return pre[kMmaThreads - 1];
}

// Aligned item w: its slot (l) and alignment block, from the entries' inclusive prefix.
__device__ __forceinline__ int64_t item_block(const Params& p, int64_t w, const int* pre, const int* slot, int& l) {
  int lo = 0, hi = p.nent - 1;  // the first entry whose prefix passes w
  while (lo < hi) {
    const int mid = (lo + hi) / 2;
    if (pre[mid] > w) hi = mid; else lo = mid + 1;
  }
  l = slot[lo];
  return w - (lo > 0 ? pre[lo - 1] : 0);
}

// Item w's slot and expert, its valid pairs compacted into pairs_sh (every thread returns the same
// count; 0 when the item adds nothing). Ends with a barrier.
__device__ __forceinline__ int item_pairs(const Params& p, int64_t w, const int* pre, const int* slot, int* pairs_sh,
                                          int* npairs_sh, int& l, int& e) {
  if (p.naive) {
    l = p.map[w / p.top_k];
    e = p.eids[w];
    if (l < 0 || l >= p.L || (p.enabled && p.enabled[l] == 0) || e < 0 || e >= p.E) return 0;
    __syncthreads();  // (the expands' tile loops have no barrier) the previous item's pairs_sh read
    if (threadIdx.x == 0) pairs_sh[0] = int(w);
    __syncthreads();
    return 1;
  }
  const int64_t b = item_block(p, w, pre, slot, l);
  e = p.eids[int64_t(l) * p.Q + b];
  if (e < 0 || e >= p.E) return 0;
  if (threadIdx.x == 0) *npairs_sh = 0;
  __syncthreads();
  const int64_t start = b * p.bs;
  const int32_t* list = p.sorted + int64_t(l) * p.P + start;
  for (int q = threadIdx.x; q < p.bs && start + q < p.P; q += kMmaThreads) {
    const int32_t v = list[q];
    if (v >= 0 && v < p.numel) pairs_sh[atomicAdd(npairs_sh, 1)] = v;
  }
  __syncthreads();
  const int n = *npairs_sh;
  __syncthreads();  // every thread has the count before the next item resets it
  return n;
}

// Split-K: the parts' fp32 sums go to the one call's scratch (ld.cg back: other blocks wrote them).
__device__ __forceinline__ float ld_part(const float* q) {
#ifdef PUNICA_BLOCK_EMU
  return *q;
#else
  return __ldcg(q);
#endif
}
__device__ __forceinline__ void fence_gpu() {
#ifndef PUNICA_BLOCK_EMU
  __threadfence();
#endif
}

// Shrink-only: inter[s, pair, 0:rA] = round_I(A[l,e] . x[row(pair)]) for the item's pairs, zero past
// the local true rank. Warps split K in 32-wide chunks (thread t holds k = 8t..8t+7 of each: a
// 16-byte load of an x row and of an A row), U chunks' loads in flight before their mma, then add
// their 16 x (8 NT) tiles in shared memory. Split-K (p.ksplit > 1, blockIdx.y = part): a block
// covers its part's chunks of K and stores the item's fp32 sums in the scratch
// (part[kp][s][pair][j]); the item's last block (a ticket per (slice, item) in zeroed counters)
// adds the parts in order 0..ksplit-1 and rounds them into the intermediate. Items past the grid
// (never with the plan's item count) are done whole by part 0.
template <class T, class TI, int NT>
__global__ void __launch_bounds__(kMmaThreads, 4) moe_mma_shrink_kernel(Params p) {
  constexpr int U = NT >= 8 ? 1 : NT >= 4 ? 2 : 4;  // chunks per warp in flight (registers)
  __shared__ int pre_sh[kMmaThreads], slot_sh[kMmaThreads];
  __shared__ int pairs_sh[kMoeLoraMaxBlockSize];
  __shared__ int npairs_sh;
  __shared__ int last_sh;
  __shared__ float red_sh[kMmaWarps][kMmaRows][NT * 8 + 1];
  const int64_t total = work_prefix(p, pre_sh, slot_sh);
  const int s = blockIdx.z, kp = blockIdx.y;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const T* x = static_cast<const T*>(p.x);
  const int64_t nkc = (p.K + 31) / 32;
  const int64_t cps = (nkc + p.ksplit - 1) / p.ksplit;  // chunks per part
  for (int64_t w = blockIdx.x; w < total; w += gridDim.x) {
    const bool split = p.ksplit > 1 && w < int64_t(gridDim.x);
    if (!split && kp != 0) continue;  // uniform over the block
    int l, e;
    const int npairs = item_pairs(p, w, pre_sh, slot_sh, pairs_sh, &npairs_sh, l, e);
    if (npairs == 0) continue;
    const int rank_l = p.ranks ? p.ranks[l] : p.rB;
    const int rl = max(0, min(rank_l - p.a_off, p.rA));
    const T* A = static_cast<const T*>(p.A[s]) + int64_t(l) * p.a_lora_stride + int64_t(e) * p.a_expert_stride;
    const int64_t kc_lo = split ? min(nkc, kp * cps) : 0, kc_hi = split ? min(nkc, kc_lo + cps) : nkc;
    for (int c0 = 0; c0 < npairs; c0 += kMmaRows) {
      const int cn = min(kMmaRows, npairs - c0);
      const T* xr0 = nullptr;
      const T* xr1 = nullptr;
      if (g < cn) { const int64_t pr = pairs_sh[c0 + g]; xr0 = x + (p.mul ? pr : pr / p.top_k) * p.ldx; }
      if (g + 8 < cn) { const int64_t pr = pairs_sh[c0 + g + 8]; xr1 = x + (p.mul ? pr : pr / p.top_k) * p.ldx; }
      float acc[NT][4];
#pragma unroll
      for (int n = 0; n < NT; ++n) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.f;
      const T* arow = A + int64_t(g) * p.K;  // this thread's A rows: n * 8 + g, 8 K apart
      const int64_t astep = int64_t(8) * p.K;
      const int K = int(p.K), hi = int(kc_hi);
      for (int kb = int(kc_lo) + warp; kb < hi; kb += kMmaWarps * U) {
        uint4 xa[U], xb[U], av[U][NT];
#pragma unroll
        for (int u = 0; u < U; ++u) {
          const int kc = kb + u * kMmaWarps, k = kc * 32 + t * 8;
          const bool kin = kc < hi && k < K;
          xa[u] = make_uint4(0u, 0u, 0u, 0u);
          xb[u] = make_uint4(0u, 0u, 0u, 0u);
          if (kin && xr0) xa[u] = ldg16(xr0 + k);
          if (kin && xr1) xb[u] = ldg16(xr1 + k);
#pragma unroll
          for (int n = 0; n < NT; ++n) {
            av[u][n] = make_uint4(0u, 0u, 0u, 0u);
            if (n * 8 + g < rl && kin) av[u][n] = ldg16(arow + n * astep + k);
          }
        }
#pragma unroll
        for (int u = 0; u < U; ++u) {
          const uint32_t a0[4] = {xa[u].x, xb[u].x, xa[u].y, xb[u].y};
          const uint32_t a1[4] = {xa[u].z, xb[u].z, xa[u].w, xb[u].w};
#pragma unroll
          for (int n = 0; n < NT; ++n) {
            if (n * 8 < rl) {
              const uint32_t b0[2] = {av[u][n].x, av[u][n].y}, b1[2] = {av[u][n].z, av[u][n].w};
              mma16816<T>(acc[n], a0, b0);
              mma16816<T>(acc[n], a1, b1);
            }
          }
        }
      }
#pragma unroll
      for (int n = 0; n < NT; ++n) {
        red_sh[warp][g][n * 8 + 2 * t] = acc[n][0];
        red_sh[warp][g][n * 8 + 2 * t + 1] = acc[n][1];
        red_sh[warp][g + 8][n * 8 + 2 * t] = acc[n][2];
        red_sh[warp][g + 8][n * 8 + 2 * t + 1] = acc[n][3];
      }
      __syncthreads();
      for (int idx = threadIdx.x; idx < cn * p.rA; idx += kMmaThreads) {
        const int q = idx / p.rA, j = idx % p.rA;
        float v = 0.f;
#pragma unroll
        for (int ww = 0; ww < kMmaWarps; ++ww) v += red_sh[ww][q][j];
        const int64_t pr = pairs_sh[c0 + q];
        if (split) p.part[((int64_t(kp) * p.S + s) * p.numel + pr) * p.rA + j] = v;
        else static_cast<TI*>(p.inter)[(int64_t(s) * p.numel + pr) * p.rA + j] = fromf<TI>(v);
      }
      __syncthreads();
    }
    if (split) {
      // the threadFenceReduction pattern: every part's sums visible before its ticket
      fence_gpu();
      __syncthreads();
      if (threadIdx.x == 0) last_sh = atomicAdd(&p.ticket[int64_t(s) * gridDim.x + w], 1) == p.ksplit - 1;
      __syncthreads();
      if (last_sh) {
        fence_gpu();
        for (int idx = threadIdx.x; idx < npairs * p.rA; idx += kMmaThreads) {
          const int q = idx / p.rA, j = idx % p.rA;
          const int64_t pr = pairs_sh[q];
          float v = 0.f;
          for (int k2 = 0; k2 < p.ksplit; ++k2) v += ld_part(p.part + ((int64_t(k2) * p.S + s) * p.numel + pr) * p.rA + j);
          static_cast<TI*>(p.inter)[(int64_t(s) * p.numel + pr) * p.rA + j] = fromf<TI>(v);
        }
      }
    }
  }
}

// y[row, col .. col + 8) (+)= round(w * a): 16 bytes at once (`old`: the row's y loaded before) or
// element by element up to `left` columns (rows without 16-byte alignment).
template <class T>
__device__ __forceinline__ void store_y8(const Params& p, T* yp, const float* a, float wgt, const uint4& old,
                                         int64_t left) {
  if (p.vec_y) {
    const uint32_t in[4] = {old.x, old.y, old.z, old.w};
    uint32_t out[4];
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      const float lo = (p.add ? bits_to_f<T>(in[c] & 0xffffu) : 0.f) + round_as<T>(a[2 * c] * wgt);
      const float hi = (p.add ? bits_to_f<T>(in[c] >> 16) : 0.f) + round_as<T>(a[2 * c + 1] * wgt);
      out[c] = f_to_bits<T>(lo) | (f_to_bits<T>(hi) << 16);
    }
    // one st.global.v4 (kernels/common/vec_store.cuh): a plain uint4 store through yp came out as
    // four st.global.u32 (SASS at 54cb5c7; ncu on the H100, Mixtral w13 T=4096 rank 64: global stores
    // at 8 of 32 bytes per sector, the expand 747 of ~890 µs)
    vec::st16(yp, make_uint4(out[0], out[1], out[2], out[3]));
  } else {
    for (int c = 0; c < 8 && c < left; ++c) yp[c] = fromf<T>((p.add ? tof<T>(yp[c]) : 0.f) + round_as<T>(a[c] * wgt));
  }
}

// B fragments of one n8 column (`col`) over KS k16 steps at true rank rl, zero past N.
template <int KS>
__device__ __forceinline__ void load_b_col(const Params& p, const void* Bm, int64_t col, int rl, int t,
                                           uint32_t (&bf)[KS][2]) {
#pragma unroll
  for (int ks = 0; ks < KS; ++ks) {
    uint2 v;
    v.x = v.y = 0u;
    if (ks * 16 < rl && col < p.N)
      v = ld4_masked(static_cast<const unsigned short*>(Bm) + col * p.rB, ks * 16 + 4 * t, rl);
    bf[ks][0] = v.x;
    bf[ks][1] = v.y;
  }
}

// The expand block's run of 128-column tiles [t0, t1): blockIdx.y picks p.tn of them.
__device__ __forceinline__ void block_tiles(const Params& p, int64_t& t0, int64_t& t1) {
  const int64_t ntiles = (p.N + kExpandCols - 1) / kExpandCols;
  t0 = int64_t(blockIdx.y) * p.tn;
  t1 = t0 + p.tn < ntiles ? t0 + p.tn : ntiles;
}

// A warp's 16 x 32 accumulator tile (acc[n]: n-tile n) into y from registers: after the quad
// transpose (kernels/common/mma_epilogue.cuh) the thread holds columns col .. col + 8 (col = the
// tile's + warp * 32 + 8t) of its rows g, g + 8 (row[h]: the pair, -1 none; old[h]: its y, loaded
// before), one 16-byte store each. Every lane calls it (it shuffles).
template <class T>
__device__ __forceinline__ void store_acc(const Params& p, T* y, const float (&acc)[4][4], const int64_t (&row)[2],
                                          const float (&wgt)[2], const uint4 (&old)[2], int64_t col, int s, int t) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float2 v[4];
#pragma unroll
    for (int n = 0; n < 4; ++n) v[n] = make_float2(acc[n][2 * h], acc[n][2 * h + 1]);
    mma_epi::gather<4>(v, t);
    if (row[h] < 0 || col >= p.N) continue;
    const float a[8] = {v[0].x, v[0].y, v[1].x, v[1].y, v[2].x, v[2].y, v[3].x, v[3].y};
    store_y8<T>(p, y + row[h] * p.ldy + p.offset + int64_t(s) * p.N + col, a, wgt[h], old[h], p.N - col);
  }
}

// Expand-only (intermediate in the output dtype): y[pair, offset + s*N + n] (+)= round(w * B[l,e][n] . u)
// over column tiles of 128 (a warp 4 n8 tiles); a block walks `tn` tiles of one item, the next tile's
// y loaded before the current tile's epilogue, stored from registers (no barrier per tile). u
// fragments: rows g, g + 8 of the chunk, rank j = 16 ks + 4t .. + 3 (an 8-byte load), zero past the
// true rank; B alike per column.
template <class T, int KS>
__global__ void __launch_bounds__(kMmaThreads, KS >= 4 ? 3 : 4) moe_mma_expand_kernel(Params p) {
  __shared__ int pre_sh[kMmaThreads], slot_sh[kMmaThreads];
  __shared__ int pairs_sh[kMoeLoraMaxBlockSize];
  __shared__ int npairs_sh;
  const int64_t total = work_prefix(p, pre_sh, slot_sh);
  const int s = blockIdx.z;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  int64_t tile0, tile1;
  block_tiles(p, tile0, tile1);
  T* y = static_cast<T*>(p.y);
  const T* u = static_cast<const T*>(p.inter);
  for (int64_t w = blockIdx.x; w < total; w += gridDim.x) {
    int l, e;
    const int npairs = item_pairs(p, w, pre_sh, slot_sh, pairs_sh, &npairs_sh, l, e);
    if (npairs == 0 || tile0 >= tile1) continue;
    const int rank_l = p.ranks ? p.ranks[l] : p.rB;
    const int rl = max(0, min(rank_l, p.rB));
    const T* Bm = static_cast<const T*>(p.B[s]) + int64_t(l) * p.b_lora_stride + int64_t(e) * p.b_expert_stride;
    for (int c0 = 0; c0 < npairs; c0 += kMmaRows) {
      const int cn = min(kMmaRows, npairs - c0);
      // the thread's output rows g, g + 8 of the chunk, columns warp * 32 + 8t .. + 8 of a tile
      int64_t urow[2];
      float wgt[2];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int q = g + 8 * h;
        urow[h] = q < cn ? int64_t(pairs_sh[c0 + q]) : -1;
        wgt[h] = (q < cn && p.mul) ? p.w[urow[h]] : 1.f;
      }
      const int ccol = warp * 32 + 8 * t;
      auto load_b = [&](int64_t tile, uint32_t (&bf)[4][KS][2]) {
#pragma unroll
        for (int n = 0; n < 4; ++n) load_b_col<KS>(p, Bm, tile * kExpandCols + warp * 32 + n * 8 + g, rl, t, bf[n]);
      };
      auto load_y = [&](int64_t tile, uint4 (&yv)[2]) {
        const int64_t col = tile * kExpandCols + ccol;
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          yv[h] = make_uint4(0u, 0u, 0u, 0u);
          if (p.vec_y && p.add && urow[h] >= 0 && col < p.N)
            yv[h] = ldg16(y + urow[h] * p.ldy + p.offset + int64_t(s) * p.N + col);
        }
      };
      uint32_t bcur[4][KS][2];
      // B (up to rank 32: more spills) and the routing before the wait: only u comes from the shrink
      constexpr bool kEarlyB = KS < 4;
      if (kEarlyB) load_b(tile0, bcur);
      wait_for_shrink();
      uint32_t ua[KS][4];
#pragma unroll
      for (int ks = 0; ks < KS; ++ks) {
        uint2 r0, r1;
        r0.x = r0.y = r1.x = r1.y = 0u;
        if (ks * 16 < rl) {
          if (g < cn) r0 = ld4_masked(u + (int64_t(s) * p.numel + pairs_sh[c0 + g]) * p.rB, ks * 16 + 4 * t, rl);
          if (g + 8 < cn) r1 = ld4_masked(u + (int64_t(s) * p.numel + pairs_sh[c0 + g + 8]) * p.rB, ks * 16 + 4 * t, rl);
        }
        ua[ks][0] = r0.x; ua[ks][1] = r1.x; ua[ks][2] = r0.y; ua[ks][3] = r1.y;
      }
      uint4 ycur[2], ynext[2];
      load_y(tile0, ycur);
      for (int64_t tile = tile0; tile < tile1; ++tile) {
        if (tile > tile0 || !kEarlyB) load_b(tile, bcur);
        float acc[4][4];
#pragma unroll
        for (int n = 0; n < 4; ++n) {
          acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.f;
#pragma unroll
          for (int ks = 0; ks < KS; ++ks)
            if (ks * 16 < rl) mma16816<T>(acc[n], ua[ks], bcur[n][ks]);
        }
        if (tile + 1 < tile1) load_y(tile + 1, ynext);
        store_acc<T>(p, y, acc, urow, wgt, ycur, tile * kExpandCols + ccol, s, t);
        if (tile + 1 < tile1) {
          ycur[0] = ynext[0];
          ycur[1] = ynext[1];
        }
      }
    }
  }
}

// The expand for blocks of <= 16 pairs (block_size <= 16, the common case): a block takes G
// consecutive items (mostly one (slot, expert) run) so each B tile is loaded once for all of them
// and their y rows are in flight together; u of every item stays in registers across the tiles.
template <class T, int KS, int G>
__global__ void __launch_bounds__(kMmaThreads, 3) moe_mma_expand_group_kernel(Params p) {
  __shared__ int pre_sh[kMmaThreads], slot_sh[kMmaThreads];
  __shared__ int pairs_sh[G][kMmaRows];
  __shared__ int n_sh[G], l_sh[G], e_sh[G];
  int64_t tile0, tile1;
  block_tiles(p, tile0, tile1);
  T* y = static_cast<T*>(p.y);
  const T* u = static_cast<const T*>(p.inter);
  const int64_t total = work_prefix(p, pre_sh, slot_sh);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g8 = lane / 4, t = lane % 4, s = blockIdx.z;
  for (int64_t w0 = int64_t(blockIdx.x) * G; w0 < total; w0 += int64_t(gridDim.x) * G) {
    if (threadIdx.x < G) n_sh[threadIdx.x] = 0;
    __syncthreads();
    if (warp < G && w0 + warp < total) {  // warp g gathers item w0 + g
      const int64_t w = w0 + warp;
      int l, e;
      bool ok;
      if (p.naive) {
        l = p.map[w / p.top_k];
        e = p.eids[w];
        ok = l >= 0 && l < p.L && !(p.enabled && p.enabled[l] == 0) && e >= 0 && e < p.E;
        if (ok && lane == 0) pairs_sh[warp][atomicAdd(&n_sh[warp], 1)] = int(w);
      } else {
        const int64_t b = item_block(p, w, pre_sh, slot_sh, l);
        e = p.eids[int64_t(l) * p.Q + b];
        ok = e >= 0 && e < p.E;
        const int64_t start = b * p.bs;
        if (ok && lane < p.bs && start + lane < p.P) {
          const int32_t v = p.sorted[int64_t(l) * p.P + start + lane];
          if (v >= 0 && v < p.numel) pairs_sh[warp][atomicAdd(&n_sh[warp], 1)] = v;
        }
      }
      if (lane == 0) { l_sh[warp] = l; e_sh[warp] = e; }
    }
    __syncthreads();
    wait_for_shrink();
    uint32_t ua[G][KS][4];
    int rl[G];
#pragma unroll
    for (int g = 0; g < G; ++g) {
      const int n = n_sh[g];
      rl[g] = 0;
      if (n > 0) rl[g] = max(0, min(p.ranks ? p.ranks[l_sh[g]] : p.rB, p.rB));
#pragma unroll
      for (int ks = 0; ks < KS; ++ks) {
        uint2 r0, r1;
        r0.x = r0.y = r1.x = r1.y = 0u;
        if (ks * 16 < rl[g]) {
          if (g8 < n) r0 = ld4_masked(u + (int64_t(s) * p.numel + pairs_sh[g][g8]) * p.rB, ks * 16 + 4 * t, rl[g]);
          if (g8 + 8 < n) r1 = ld4_masked(u + (int64_t(s) * p.numel + pairs_sh[g][g8 + 8]) * p.rB, ks * 16 + 4 * t, rl[g]);
        }
        ua[g][ks][0] = r0.x; ua[g][ks][1] = r1.x; ua[g][ks][2] = r0.y; ua[g][ks][3] = r1.y;
      }
    }
    for (int64_t tile = tile0; tile < tile1; ++tile) {
      // y of every item's rows first: the thread's rows g8, g8 + 8, columns warp * 32 + 8t .. + 8
      const int64_t col = tile * kExpandCols + warp * 32 + 8 * t;
      uint4 yv[G][2];
#pragma unroll
      for (int g = 0; g < G; ++g)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int q = g8 + 8 * h;
          yv[g][h] = make_uint4(0u, 0u, 0u, 0u);
          if (p.vec_y && p.add && q < n_sh[g] && col < p.N)
            yv[g][h] = ldg16(y + int64_t(pairs_sh[g][q]) * p.ldy + p.offset + int64_t(s) * p.N + col);
        }
      uint32_t bf[4][KS][2];
      int key_l = -1, key_e = -1;
#pragma unroll
      for (int g = 0; g < G; ++g) {
        const int n = n_sh[g];
        if (n == 0) continue;
        if (l_sh[g] != key_l || e_sh[g] != key_e) {  // B tile of this item's (slot, expert)
          key_l = l_sh[g];
          key_e = e_sh[g];
          const T* Bm = static_cast<const T*>(p.B[s]) + int64_t(key_l) * p.b_lora_stride + int64_t(key_e) * p.b_expert_stride;
#pragma unroll
          for (int nn = 0; nn < 4; ++nn) load_b_col<KS>(p, Bm, tile * kExpandCols + warp * 32 + nn * 8 + g8, rl[g], t, bf[nn]);
        }
        float acc[4][4];
#pragma unroll
        for (int nn = 0; nn < 4; ++nn) {
          acc[nn][0] = acc[nn][1] = acc[nn][2] = acc[nn][3] = 0.f;
#pragma unroll
          for (int ks = 0; ks < KS; ++ks)
            if (ks * 16 < rl[g]) mma16816<T>(acc[nn], ua[g][ks], bf[nn][ks]);
        }
        int64_t row[2];
        float wgt[2];
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int q = g8 + 8 * h;
          row[h] = q < n ? int64_t(pairs_sh[g][q]) : -1;
          wgt[h] = (q < n && p.mul) ? p.w[row[h]] : 1.f;
        }
        store_acc<T>(p, y, acc, row, wgt, yv[g], col, s, t);
      }
    }
    __syncthreads();  // (no barrier in the tile loop) every thread is done with pairs_sh / n_sh
  }
}

void usage(const std::string& msg) { fail(ErrorKind::usage, "add_lora_fused_moe: " + msg); }

Params make_params(const FusedMoeLoraArgs& a, int mode) {
  if (a.dtype != DType::f16 && a.dtype != DType::bf16) usage("dtype must be fp16 or bf16");
  if (a.num_tokens < 0 || a.top_k < 1) usage("bad num_tokens / top_k");
  if (a.num_slices < 1 || a.num_slices > kMaxSlices) usage("num_slices outside [1, 8]");
  if (a.max_loras < 0 || a.num_experts < 0 || a.slice_width < 0 || a.hidden < 0 || a.offset < 0) usage("negative size");
  const int rA = a.a_rank > 0 ? a.a_rank : a.max_rank;
  if (a.max_rank < 1 || a.max_rank > kMoeLoraMaxRank || rA > kMoeLoraMaxRank) usage("rank outside [1, 512]");
  if (mode == kFused && (rA != a.max_rank || a.a_rank_offset != 0))
    usage("the one-call form needs a_rank == max_rank and a_rank_offset == 0 (sharded: use the split)");
  if (!a.routing.naive && (a.routing.block_size < 1 || a.routing.block_size > kMoeLoraMaxBlockSize))
    usage("block_size outside [1, 256]");
  if (a.mul_routed_weight && mode != kShrinkOnly && !a.topk_weights) usage("mul_routed_weight without topk_weights");
  Params p{};
  p.numel = a.num_tokens * a.top_k;
  if (p.numel >= (int64_t(1) << 31)) usage("too many pairs");
  if (a.hidden >= (int64_t(1) << 30)) usage("hidden too large");
  p.top_k = a.top_k;
  p.K = a.hidden;
  p.x = a.x;
  p.ldx = a.x_row_stride > 0 ? a.x_row_stride : a.hidden;
  p.mul = a.mul_routed_weight;
  p.w = a.topk_weights;
  for (int s = 0; s < a.num_slices; ++s) {
    p.A[s] = a.lora_a[s];
    p.B[s] = a.lora_b[s];
    if (mode != kExpandOnly && !a.lora_a[s]) usage("null lora_a");
    if (mode != kShrinkOnly && !a.lora_b[s]) usage("null lora_b");
  }
  const int64_t Ea = a.shared_a ? 1 : a.num_experts, Eb = a.shared_b ? 1 : a.num_experts;
  p.a_expert_stride = a.shared_a ? 0 : int64_t(rA) * a.hidden;
  p.a_lora_stride = Ea * rA * a.hidden;
  p.b_expert_stride = a.shared_b ? 0 : a.slice_width * a.max_rank;
  p.b_lora_stride = Eb * a.slice_width * a.max_rank;
  p.E = a.num_experts;
  p.N = a.slice_width;
  p.L = a.max_loras;
  p.rA = rA;
  p.rB = a.max_rank;
  p.a_off = a.a_rank_offset;
  p.ranks = a.lora_ranks;
  p.map = a.token_lora_mapping;
  p.enabled = a.adapter_enabled;
  p.naive = a.routing.naive;
  p.bs = a.routing.block_size;
  p.P = a.routing.max_padded;
  p.Q = p.naive ? 0 : (p.P + p.bs - 1) / p.bs;
  p.sorted = a.routing.sorted_token_ids;
  p.eids = a.routing.expert_ids;
  p.ntpp = a.routing.num_tokens_post_pad;
  p.lora_ids = a.routing.lora_ids;
  p.y = a.y;
  p.ldy = a.y_row_stride > 0 ? a.y_row_stride : a.offset + int64_t(a.num_slices) * a.slice_width;
  p.offset = a.offset;
  p.add = a.add_inputs;
  p.inter = a.intermediate;
  p.vec_k = a.hidden % 8 == 0 && p.ldx % 8 == 0 && aligned16(a.x);
  for (int s = 0; s < a.num_slices; ++s) p.vec_k = p.vec_k && aligned16(a.lora_a[s]);
  p.vec_b = a.max_rank % 8 == 0;
  for (int s = 0; s < a.num_slices; ++s) p.vec_b = p.vec_b && aligned16(a.lora_b[s]);
  if (p.numel > 0) {
    if (!a.token_lora_mapping || !a.routing.expert_ids) usage("null mapping / routing");
    if (!p.naive && (!a.routing.sorted_token_ids || !a.routing.num_tokens_post_pad || p.P <= 0))
      usage("aligned routing without sorted_token_ids / num_tokens_post_pad / max_padded");
    if (mode != kExpandOnly && !a.x) usage("null x");
    if (mode != kShrinkOnly && !a.y) usage("null y");
    if (mode != kFused && !a.intermediate) usage("the split form needs the intermediate buffer");
    if (mode != kShrinkOnly && p.ldy < a.offset + int64_t(a.num_slices) * a.slice_width) usage("y row too short");
  }
  return p;
}

// Work-spreading heuristics. A (pair group, slice) used to be one block streaming r x K of A and
// N x r of B; at decode that is a handful of SMs. `busy` estimates the blocks that have work (each
// holds >= 1 pair, so at most numel of them) against kTargetBlocks (~2 waves of an H100/H200).
constexpr int64_t kTargetBlocks = 264;
constexpr int64_t kMaxZ = 65535;  // gridDim.z limit

int64_t busy_blocks(const Params& p) {
  const int64_t lg = p.lora_ids ? p.L + 1 : p.L;
  return std::max<int64_t>(1, p.naive ? p.numel : std::min(p.numel, p.Q * lg)) * p.S;
}

// Expand column tiles: kThreads columns (one per thread) while the grid is small, else 2x that.
// `fused`: the one-call kernel recomputes the shrink in every tile, so tiles are capped so the
// repeated A reads (rA x K each) stay below the B tile each one reads (tn x rB).
void plan_expand(Params& p, bool fused) {
  const bool small = busy_blocks(p) < kTargetBlocks;
  int64_t tn = small ? kThreads : 2 * kThreads;
  if (fused) {
    if (!small) tn = p.N;
    else tn = std::max<int64_t>(tn, (int64_t(p.rA) * p.K + p.rB - 1) / p.rB);
  }
  tn = std::max<int64_t>(1, std::min<int64_t>(tn, p.N));
  int64_t nz = (p.N + tn - 1) / tn;
  const int64_t zcap = std::max<int64_t>(1, kMaxZ / p.S);
  if (nz > zcap) { nz = zcap; tn = (p.N + nz - 1) / nz; nz = (p.N + tn - 1) / tn; }
  p.tn = tn;
  p.nz = int(std::max<int64_t>(1, nz));
}

// Shrink-only row groups while the grid is small (each group re-reads the chunk's x rows, so at
// large M the rows stay together). Under kWarps rows a group splits K over kWarps / rows warps
// per row: a warp's chain of dependent K steps, not the SM count, bounds a decode shrink.
void plan_shrink(Params& p) {
  const int64_t busy = busy_blocks(p);
  int groups = 1;
  if (busy < kTargetBlocks) groups = int(std::min<int64_t>((kTargetBlocks + busy - 1) / busy, p.rA));
  groups = std::max(1, groups);
  p.rows = (p.rA + groups - 1) / groups;
  p.kparts = 1;
  if (groups > 1 && p.rows < kWarps) {
    int r = 1;
    while (r < p.rows) r *= 2;  // a divisor of kWarps
    p.rows = r;
    p.kparts = kWarps / r;
  }
  p.nz = (p.rA + p.rows - 1) / p.rows;
  p.tn = p.N;
}

// `pdl`: launched as a programmatic dependent of the kernel before it (the one call's expand).
template <class K>
void launch_params(K kernel, dim3 grid, int threads, std::size_t smem, cudaStream_t st, bool pdl, const Params& p) {
  if (!pdl) {
    kernel<<<grid, threads, smem, st>>>(p);
    return;
  }
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  // (grid, block, dynamic smem, stream, attributes, count): positional, as the block emulator
  // defines gridDim / blockDim as macros
  const cudaLaunchConfig_t cfg = {grid, dim3(unsigned(threads)), smem, st, attr, 1};
  PUNICA_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, p));
}

template <class T, class TI>
void launch_typed(const Params& p, int mode, int S, cudaStream_t st, bool pdl) {
  const dim3 grid(unsigned(p.naive ? p.numel : p.Q), unsigned(p.naive ? 1 : (p.lora_ids ? p.L + 1 : p.L)),
                  unsigned(S * p.nz));
  const std::size_t smem = std::size_t(kChunk) * std::max(p.rA, p.rB) * sizeof(float);
  auto go = [&](auto kernel) {
    if (smem > 48 * 1024)
      PUNICA_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    launch_params(kernel, grid, kThreads, smem, st, pdl, p);
  };
  if (mode == kFused) go(fused_moe_lora_kernel<T, TI, kFused>);
  else if (mode == kShrinkOnly) go(fused_moe_lora_kernel<T, TI, kShrinkOnly>);
  else go(fused_moe_lora_kernel<T, TI, kExpandOnly>);
  PUNICA_CUDA_CHECK_LAUNCH();
}

template <class T, class TI>
void launch_mma(const Params& p, int mode, cudaStream_t st, bool pdl) {
  const dim3 grid(unsigned(std::max<int64_t>(1, p.wmax)), unsigned(mode == kShrinkOnly ? p.ksplit : p.nz), unsigned(p.S));
  if (mode == kShrinkOnly) {
    if (p.rA <= 16) launch_params(moe_mma_shrink_kernel<T, TI, 2>, grid, kMmaThreads, 0, st, pdl, p);
    else if (p.rA <= 32) launch_params(moe_mma_shrink_kernel<T, TI, 4>, grid, kMmaThreads, 0, st, pdl, p);
    else launch_params(moe_mma_shrink_kernel<T, TI, 8>, grid, kMmaThreads, 0, st, pdl, p);
  } else if (p.group > 1) {
    const dim3 g(unsigned(std::max<int64_t>(1, (p.wmax + p.group - 1) / p.group)), unsigned(p.nz), unsigned(p.S));
    if (p.rB <= 16) launch_params(moe_mma_expand_group_kernel<T, 1, 4>, g, kMmaThreads, 0, st, pdl, p);
    else if (p.rB <= 32) launch_params(moe_mma_expand_group_kernel<T, 2, 4>, g, kMmaThreads, 0, st, pdl, p);
    else launch_params(moe_mma_expand_group_kernel<T, 4, 2>, g, kMmaThreads, 0, st, pdl, p);
  } else {
    if (p.rB <= 16) launch_params(moe_mma_expand_kernel<T, 1>, grid, kMmaThreads, 0, st, pdl, p);
    else if (p.rB <= 32) launch_params(moe_mma_expand_kernel<T, 2>, grid, kMmaThreads, 0, st, pdl, p);
    else launch_params(moe_mma_expand_kernel<T, 4>, grid, kMmaThreads, 0, st, pdl, p);
  }
  PUNICA_CUDA_CHECK_LAUNCH();
}

// The tensor-core kernels take their plan where every operand they load 16 (8) bytes wide is aligned.
bool mma_aligned(const FusedMoeLoraArgs& a, int mode) {
  bool ok = aligned16(a.intermediate);
  for (int s = 0; s < a.num_slices; ++s)
    ok = ok && (mode == kShrinkOnly ? aligned16(a.lora_a[s]) : aligned16(a.lora_b[s]));
  if (mode == kShrinkOnly) ok = ok && aligned16(a.x) && (a.x_row_stride <= 0 || a.x_row_stride % 8 == 0);
  return ok;
}

// The one call's scratch (fused_moe_lora_workspace_bytes): the intermediate [S, M k, r], then for
// the split-K shrink (rank <= 64, fewer than kSplitSlots pairs) the tickets [S][2 M k] (a plan's
// items never pass 2 M k: ceil(M k / bs) + min(M k, entries E)) and the parts [parts][S][M k][r]
// fp32, each region 256-byte aligned.
struct ScratchLayout {
  std::size_t ticket = 0, part = 0, total = 0;
  int parts = 1;  // split-K parts the region holds per pair (1: no region)
};
std::size_t align256(std::size_t n) { return (n + 255) / 256 * 256; }
ScratchLayout scratch_layout(int64_t num_tokens, int top_k, int num_slices, int max_rank, DType inter_dtype) {
  ScratchLayout r;
  const std::size_t numel = std::size_t(std::max<int64_t>(num_tokens, 0)) * std::size_t(std::max(top_k, 0));
  const std::size_t S = std::size_t(std::max(num_slices, 0)), R = std::size_t(std::max(max_rank, 0));
  r.total = numel * S * R * dtype_size(inter_dtype);
  const int parts = moe_heur::split_max_parts(int64_t(numel));
  if (numel == 0 || parts <= 1 || max_rank > moe_heur::kMmaMaxRank) return r;
  r.parts = parts;
  r.ticket = align256(r.total);
  r.part = align256(r.ticket + S * 2 * numel * sizeof(int));
  r.total = r.part + std::size_t(parts) * S * numel * R * sizeof(float);
  return r;
}

// `scratch`: a.intermediate is the one call's scratch (split-K may use its tail).
void run(const FusedMoeLoraArgs& a, int mode, cudaStream_t st, bool clear = true, bool pdl = false,
         bool scratch = false) {
  Params p = make_params(a, mode);
  p.S = a.num_slices;
  p.rows = p.rA;
  p.kparts = 1;
  p.ksplit = 1;
  p.nent = a.routing.lora_ids ? a.max_loras + 1 : a.max_loras;
  const moe_heur::Plan plan = moe_heur::plan(a, mode != kFused, scratch);
  const bool mma = mode != kFused && mma_aligned(a, mode) &&
                   (mode == kShrinkOnly ? plan.shrink : plan.expand) == moe_heur::Kernel::mma;
  if (mma) {
    p.wmax = plan.items;
    p.vec_y = aligned16(a.y) && p.ldy % 8 == 0 && a.offset % 8 == 0 && a.slice_width % 8 == 0;
    if (mode == kShrinkOnly) {
      p.nz = 1;
      const ScratchLayout sl = scratch_layout(a.num_tokens, a.top_k, a.num_slices, a.max_rank, a.inter_dtype());
      if (scratch && plan.ksplit > 1 && plan.ksplit <= sl.parts && p.wmax <= 2 * p.numel && p.rA == p.rB) {
        p.ksplit = plan.ksplit;
        p.ticket = reinterpret_cast<int*>(static_cast<char*>(a.intermediate) + sl.ticket);
        p.part = reinterpret_cast<float*>(static_cast<char*>(a.intermediate) + sl.part);
      }
    } else {
      const int64_t tiles = (p.N + kExpandCols - 1) / kExpandCols;
      const int64_t groups = std::max<int64_t>(1, (tiles + plan.tiles_per_block - 1) / plan.tiles_per_block);
      p.tn = (tiles + groups - 1) / groups;  // column tiles per block
      p.group = plan.items_per_block;
      p.nz = int(std::max<int64_t>(1, (tiles + p.tn - 1) / p.tn));
    }
  } else if (mode == kShrinkOnly) {
    plan_shrink(p);
  } else {
    plan_expand(p, mode == kFused);
  }
  if (mode == kShrinkOnly && clear && p.numel > 0)
    PUNICA_CUDA_CHECK(cudaMemsetAsync(a.intermediate, 0,
                                      std::size_t(a.num_slices) * p.numel * p.rA * dtype_size(a.inter_dtype()), st));
  if (p.numel == 0 || p.L == 0 || p.E == 0) return;
  if (!p.naive && p.Q == 0) return;
  if (p.ksplit > 1)  // the split-K tickets start at 0 (a memset node: graph capturable)
    PUNICA_CUDA_CHECK(cudaMemsetAsync(p.ticket, 0, std::size_t(p.S) * std::size_t(p.wmax) * sizeof(int), st));
  const bool h = a.dtype == DType::f16;
  if (mma) {
    switch (a.inter_dtype()) {
      case DType::f32: h ? launch_mma<__half, float>(p, mode, st, pdl) : launch_mma<__nv_bfloat16, float>(p, mode, st, pdl); break;
      case DType::f16: h ? launch_mma<__half, __half>(p, mode, st, pdl) : launch_mma<__nv_bfloat16, __half>(p, mode, st, pdl); break;
      case DType::bf16:
        h ? launch_mma<__half, __nv_bfloat16>(p, mode, st, pdl) : launch_mma<__nv_bfloat16, __nv_bfloat16>(p, mode, st, pdl);
        break;
    }
    return;
  }
  switch (a.inter_dtype()) {
    case DType::f32: h ? launch_typed<__half, float>(p, mode, a.num_slices, st, pdl)
                       : launch_typed<__nv_bfloat16, float>(p, mode, a.num_slices, st, pdl); break;
    case DType::f16: h ? launch_typed<__half, __half>(p, mode, a.num_slices, st, pdl)
                       : launch_typed<__nv_bfloat16, __half>(p, mode, a.num_slices, st, pdl); break;
    case DType::bf16: h ? launch_typed<__half, __nv_bfloat16>(p, mode, a.num_slices, st, pdl)
                        : launch_typed<__nv_bfloat16, __nv_bfloat16>(p, mode, a.num_slices, st, pdl); break;
  }
}

// The one call through the caller's scratch: a row-split shrink, then a column-tiled expand, so a
// decode step spreads over many SMs. Never slower in bytes (the buffer is S*M*k*r), one launch
// more. The expand reads only rows the shrink wrote (same blocks, same skips), so no clearing.
bool fused_use_split(const FusedMoeLoraArgs& a) { return a.intermediate != nullptr; }

}  // namespace

void launch_add_lora_fused_moe(const FusedMoeLoraArgs& a, cudaStream_t st) {
  if (!fused_use_split(a)) { run(a, kFused, st); return; }
  (void)make_params(a, kFused);  // the one-call form's argument rules
  run(a, kShrinkOnly, st, /*clear=*/false, /*pdl=*/false, /*scratch=*/true);
  run(a, kExpandOnly, st, /*clear=*/true, /*pdl=*/true);
}
void launch_fused_moe_lora_shrink(const FusedMoeLoraArgs& a, cudaStream_t st) { run(a, kShrinkOnly, st); }
void launch_fused_moe_lora_expand(const FusedMoeLoraArgs& a, cudaStream_t st) { run(a, kExpandOnly, st); }

std::size_t fused_moe_lora_workspace_bytes(int64_t num_tokens, int top_k, int num_slices, int max_rank,
                                           DType inter_dtype) {
  return scratch_layout(num_tokens, top_k, num_slices, max_rank, inter_dtype).total;
}

MoeLoraRoutingElems moe_lora_w13_routing_elems(int64_t max_tokens, int top_k, int num_experts_k, int block_size,
                                               int max_loras, bool pad_sorted_ids) {
  const int64_t numel = max_tokens * top_k;
  const MoeLoraAlignSizes sz = moe_lora_align_sizes(numel, num_experts_k, block_size, pad_sorted_ids);
  MoeLoraRoutingElems r;
  r.sorted = int64_t(max_loras) * sz.max_padded;
  r.expert_ids = std::max<int64_t>(int64_t(max_loras) * sz.max_blocks, numel);
  r.num_tokens_post_pad = max_loras;
  return r;
}

MoeLoraRouting launch_add_lora_w13(const AddLoraW13Args& a, cudaStream_t st) {
  FusedMoeLoraArgs op = a.op;
  op.mul_routed_weight = false;
  op.routing = moe_lora_w13_routing(a);
  if (!op.routing.naive) launch_moe_lora_align(moe_lora_w13_align_args(a), st);
  launch_add_lora_fused_moe(op, st);
  return op.routing;
}

void launch_add_lora_w2(const FusedMoeLoraArgs& a, cudaStream_t st) {
  FusedMoeLoraArgs op = a;
  op.mul_routed_weight = true;
  launch_add_lora_fused_moe(op, st);
}

}  // namespace punica::kernels
