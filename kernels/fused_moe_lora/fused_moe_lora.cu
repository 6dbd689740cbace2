// add_lora_fused_moe on the device (SPEC §4.3, A.6). One kernel per (work tile, slice): a tile is
// one block of the aligned path (<= block_size pairs sharing (slot, expert)) or one pair of the
// naive path. The tile's pairs go through in chunks of kChunk: the shrink (a warp per rank row,
// 16-byte loads along K, the chunk's x rows against one A row) leaves round_I(A.x) in shared
// memory, the expand (a thread per output column, 16-byte loads of its B row) adds the delta.
// Work is proportional to each adapter's true rank: A rows / B columns beyond it are never read.
// The split form runs the same kernel as shrink-only and expand-only through a global buffer.
#include "kernels/fused_moe_lora/fused_moe_lora.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <string>

#include "kernels/common/cuda_check.h"
#include "kernels/common/error.h"

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
  int64_t tn;     // expand columns per tile
  int rows;       // shrink-only: A rows per row group
  int kparts;     // shrink-only: warps per A row (K split; rows * kparts == kWarps when > 1)
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

template <class T, class TI, int MODE>
__global__ void __launch_bounds__(kThreads) fused_moe_lora_kernel(Params p) {
  extern __shared__ float u_sh[];  // [kChunk][max(rA, rB)]
  __shared__ int pairs_sh[kMoeLoraMaxBlockSize];
  __shared__ int64_t xoff_sh[kChunk];
  __shared__ int npairs_sh;
  __shared__ float red_sh[kWarps][kChunk];  // shrink-only K split: per-warp partial sums
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

template <class T, class TI>
void launch_typed(const Params& p, int mode, int S, cudaStream_t st) {
  const dim3 grid(unsigned(p.naive ? p.numel : p.Q), unsigned(p.naive ? 1 : (p.lora_ids ? p.L + 1 : p.L)),
                  unsigned(S * p.nz));
  const std::size_t smem = std::size_t(kChunk) * std::max(p.rA, p.rB) * sizeof(float);
  auto go = [&](auto kernel) {
    if (smem > 48 * 1024)
      PUNICA_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    kernel<<<grid, kThreads, smem, st>>>(p);
  };
  if (mode == kFused) go(fused_moe_lora_kernel<T, TI, kFused>);
  else if (mode == kShrinkOnly) go(fused_moe_lora_kernel<T, TI, kShrinkOnly>);
  else go(fused_moe_lora_kernel<T, TI, kExpandOnly>);
  PUNICA_CUDA_CHECK_LAUNCH();
}

void run(const FusedMoeLoraArgs& a, int mode, cudaStream_t st, bool clear = true) {
  Params p = make_params(a, mode);
  p.S = a.num_slices;
  p.rows = p.rA;
  p.kparts = 1;
  if (mode == kShrinkOnly) plan_shrink(p);
  else plan_expand(p, mode == kFused);
  if (mode == kShrinkOnly && clear && p.numel > 0)
    PUNICA_CUDA_CHECK(cudaMemsetAsync(a.intermediate, 0,
                                      std::size_t(a.num_slices) * p.numel * p.rA * dtype_size(a.inter_dtype()), st));
  if (p.numel == 0 || p.L == 0 || p.E == 0) return;
  if (!p.naive && p.Q == 0) return;
  const bool h = a.dtype == DType::f16;
  switch (a.inter_dtype()) {
    case DType::f32: h ? launch_typed<__half, float>(p, mode, a.num_slices, st)
                       : launch_typed<__nv_bfloat16, float>(p, mode, a.num_slices, st); break;
    case DType::f16: h ? launch_typed<__half, __half>(p, mode, a.num_slices, st)
                       : launch_typed<__nv_bfloat16, __half>(p, mode, a.num_slices, st); break;
    case DType::bf16: h ? launch_typed<__half, __nv_bfloat16>(p, mode, a.num_slices, st)
                        : launch_typed<__nv_bfloat16, __nv_bfloat16>(p, mode, a.num_slices, st); break;
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
  run(a, kShrinkOnly, st, /*clear=*/false);
  run(a, kExpandOnly, st);
}
void launch_fused_moe_lora_shrink(const FusedMoeLoraArgs& a, cudaStream_t st) { run(a, kShrinkOnly, st); }
void launch_fused_moe_lora_expand(const FusedMoeLoraArgs& a, cudaStream_t st) { run(a, kExpandOnly, st); }

std::size_t fused_moe_lora_workspace_bytes(int64_t num_tokens, int top_k, int num_slices, int max_rank,
                                           DType inter_dtype) {
  return std::size_t(std::max<int64_t>(num_tokens, 0)) * std::size_t(std::max(top_k, 0)) *
         std::size_t(std::max(num_slices, 0)) * std::size_t(std::max(max_rank, 0)) * dtype_size(inter_dtype);
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
