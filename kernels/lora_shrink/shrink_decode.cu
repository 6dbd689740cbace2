// vLLM lora_shrink (add_shrink), decode path: y[s, t, j] = scale * A_s[l][j] . x[t] for j < r_l,
// 0 for j >= r_l and for tokens with slot -1. One kernel writes all of y (no memset, no atomics):
// a block owns RB rank rows of one slice for one token (slot read straight from
// token_lora_mapping) or for up to TB tokens of one adapter, and the whole K; its 8 warps split K
// with 16-byte loads of A and x issued several at a time, and the block sums the partial dots
// through shared memory (deterministic). Rows past the true rank are never read.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <algorithm>
#include "kernels/common/cuda_check.h"
#include "kernels/common/error.h"
#include "kernels/lora_shrink/heuristics.h"
#include "kernels/lora_shrink/lora_device.cuh"
#include "kernels/lora_shrink/shrink_decode.h"
#include "kernels/lora_shrink/shrink_params.h"

namespace punica::kernels {
namespace {
using namespace lora_dev;
namespace H = shrink_heur;

using DecodeParams = ShrinkCore;  // y: [S, T, R]

template <class T, class TO, int RB, int TB, bool PER_TOKEN, bool VEC>
__global__ void __launch_bounds__(H::kDecThreads) shrink_decode_kernel(DecodeParams p) {
  constexpr int NW = H::kDecThreads / 32;
  __shared__ float red[NW][RB * TB];
  pdl_launch_dependents();
  // Until griddepcontrol.wait (pdl_wait below) this block reads only the metadata and the ranks, which
  // no kernel of a LoRA op writes (the precondition in shrink_decode.h): the slot and rank loads
  // overlap the previous kernel's tail. x, A's rows and y come after the wait.
  const int s = blockIdx.x % p.S;
  const int j0 = (blockIdx.x / p.S) * RB;
  // Every slot's rank up front (up to 32 slots), issued with the slot's own load: the slot's rank is
  // then a shuffle, so that right after griddepcontrol.wait A's rows (as many as the true rank) load
  // together with x.
  const int rk = int(threadIdx.x & 31) < p.L ? p.ranks[threadIdx.x & 31] : 0;
  int l;
  int tok[TB];
  if (PER_TOKEN) {
    static_assert(!PER_TOKEN || TB == 1, "one token per block");
    tok[0] = blockIdx.y;
    l = p.meta.token_lora_mapping[tok[0]];
  } else {
    TileRef tr;
    if (!find_tile(p.meta, p.L + 1, TB, blockIdx.y, tr, true)) return;
    l = tr.slot;
    const int nt = tr.rows(TB);
    const int start = tr.first(TB);
#pragma unroll
    for (int tt = 0; tt < TB; ++tt) tok[tt] = tt < nt ? p.meta.sorted_token_ids[start + tt] : -1;
  }
  const int rl = __shfl_sync(0xffffffffu, rk, l & 31);
  const int r = l >= 0 ? min(p.L <= 32 ? rl : p.ranks[l], p.R) : 0;
  const int nrows = max(0, min(RB, r - j0));
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  pdl_wait();  // x may be written, and y read, by the previous kernel on the stream
  TO* Y = static_cast<TO*>(p.y) + int64_t(s) * p.T * p.R;
  if (nrows == 0) {  // rows past the true rank, or a -1 token: zeros
    if (tid < RB * TB) {
      const int i = tid / TB, tt = tid % TB;
      if (tok[tt] >= 0 && j0 + i < p.R) Y[int64_t(tok[tt]) * p.R + j0 + i] = from_f<TO>(0.f);
    }
    return;
  }
  const T* A = static_cast<const T*>(p.a[s]) + (int64_t(l) * p.R + j0) * p.K;
  const T* X = static_cast<const T*>(p.x);
  float acc[RB][TB];
#pragma unroll
  for (int i = 0; i < RB; ++i)
#pragma unroll
    for (int tt = 0; tt < TB; ++tt) acc[i][tt] = 0.f;
  const int64_t nkv = (p.K + 7) / 8;
#pragma unroll 4
  for (int64_t kv = tid; kv < nkv; kv += H::kDecThreads) {
    const int64_t k = kv * 8;
    float av[RB][8], xv[TB][8];
#pragma unroll
    for (int i = 0; i < RB; ++i) {
      if (i < nrows) {
        if (VEC) {
          load8<T>(A + int64_t(i) * p.K + k, av[i]);
        } else {
#pragma unroll
          for (int e = 0; e < 8; ++e) av[i][e] = k + e < p.K ? to_f<T>(A[int64_t(i) * p.K + k + e]) : 0.f;
        }
      } else {
#pragma unroll
        for (int e = 0; e < 8; ++e) av[i][e] = 0.f;
      }
    }
#pragma unroll
    for (int tt = 0; tt < TB; ++tt) {
      if (tok[tt] >= 0) {
        const T* xp = X + int64_t(tok[tt]) * p.x_stride + k;
        if (VEC) {
          load8<T>(xp, xv[tt]);
        } else {
#pragma unroll
          for (int e = 0; e < 8; ++e) xv[tt][e] = k + e < p.K ? to_f<T>(xp[e]) : 0.f;
        }
      } else {
#pragma unroll
        for (int e = 0; e < 8; ++e) xv[tt][e] = 0.f;
      }
    }
#pragma unroll
    for (int i = 0; i < RB; ++i)
#pragma unroll
      for (int tt = 0; tt < TB; ++tt)
#pragma unroll
        for (int e = 0; e < 8; ++e) acc[i][tt] = fmaf(av[i][e], xv[tt][e], acc[i][tt]);
  }
#pragma unroll
  for (int i = 0; i < RB; ++i)
#pragma unroll
    for (int tt = 0; tt < TB; ++tt) {
      const float v = warp_sum(acc[i][tt]);
      if (lane == 0) red[warp][i * TB + tt] = v;
    }
  __syncthreads();
  if (tid < RB * TB) {
    const int i = tid / TB, tt = tid % TB;
    float v = 0.f;
#pragma unroll
    for (int w = 0; w < NW; ++w) v += red[w][tid];
    if (tok[tt] >= 0 && j0 + i < p.R) Y[int64_t(tok[tt]) * p.R + j0 + i] = from_f<TO>(i < nrows ? v * p.scale : 0.f);
  }
}


template <class T, class TO, int RB, int TB, bool PT>
void launch_cfg(const DecodeParams& p, bool vec, cudaStream_t st) {
  const int64_t rblk = (p.R + RB - 1) / RB;
  const int64_t tiles = PT ? p.T : std::min<int64_t>(p.T, (p.T + TB - 1) / TB + std::min<int64_t>(p.E, p.T));
  if (rblk == 0 || tiles == 0) return;
  PUNICA_REQUIRE(tiles <= 65535 && rblk * p.S < (int64_t(1) << 31), ErrorKind::usage,
                 "lora_shrink: too many tokens for the decode kernel");
  launch_kernel(vec ? shrink_decode_kernel<T, TO, RB, TB, PT, true> : shrink_decode_kernel<T, TO, RB, TB, PT, false>,
                dim3(unsigned(rblk * p.S), unsigned(tiles), 1), dim3(H::kDecThreads), 0, st, true, p);
}

template <class T, class TO>
void launch_out(const DecodeParams& p, bool vec, bool per_token, cudaStream_t st) {
  if (per_token) launch_cfg<T, TO, H::kDecRowsPerToken, 1, true>(p, vec, st);
  else launch_cfg<T, TO, H::kDecRowsPerTile, H::kDecTokens, false>(p, vec, st);
}

template <class T>
void launch_t(const DecodeParams& p, DType out, bool vec, bool per_token, cudaStream_t st) {
  switch (out) {
    case DType::f32: launch_out<T, float>(p, vec, per_token, st); break;
    case DType::f16: launch_out<T, __half>(p, vec, per_token, st); break;
    case DType::bf16: launch_out<T, __nv_bfloat16>(p, vec, per_token, st); break;
  }
}

}  // namespace

namespace detail {

void launch_shrink_decode(const LoraShrinkArgs& a, cudaStream_t stream) {
  launch_shrink_decode(a, H::decode_per_token(a.num_tokens, a.max_loras), stream);
}

void launch_shrink_decode(const LoraShrinkArgs& a, bool per_token, cudaStream_t stream) {
  PUNICA_REQUIRE(a.num_slices >= 1 && a.num_slices <= kMaxSlices, ErrorKind::usage,
                 "lora_shrink: num_slices must be in [1, 8]");
  PUNICA_REQUIRE(a.max_loras >= 0 && a.max_rank >= 0 && a.hidden >= 0, ErrorKind::usage, "lora_shrink: negative size");
  PUNICA_REQUIRE(a.num_active_loras >= 0, ErrorKind::usage, "lora_shrink: num_active_loras must be >= 0 (0 = not given)");
  if (a.num_tokens == 0 || a.max_rank == 0) return;
  const DecodeParams p = shrink_core(a);
  const bool vec = shrink_vec_ok(a, p);
  switch (a.dtype) {
    case DType::f32: launch_t<float>(p, a.out_dtype, vec, per_token, stream); break;
    case DType::f16: launch_t<__half>(p, a.out_dtype, vec, per_token, stream); break;
    case DType::bf16: launch_t<__nv_bfloat16>(p, a.out_dtype, vec, per_token, stream); break;
  }
}

}  // namespace detail
}  // namespace punica::kernels
