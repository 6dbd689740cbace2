// Per-row gathered mat-vec shared by add_lora_logits' shrink (u = round_w(scale * A[s] @ x[j]),
// outputs = the slot's true rank) and apply_lora_full_linear (y[j] = W[s] @ x[j] + b[s]): one block
// per (row, OPB outputs); its threads stride over the hidden dimension with 16-byte loads (x read
// once for OPB weight rows), fp32 accumulation, then a block reduction; the epilogue stores.
#pragma once
#include <cstdint>
#include <type_traits>

#include "kernels/add_lora_embedding/lora_elem.cuh"
#include "kernels/add_lora_logits/heuristics.h"
#include "kernels/common/cuda_check.h"

namespace punica::kernels::row_dot {

constexpr int kThreads = 128;

template <class T, int OPB, bool VEC, class Epi>
__global__ void __launch_bounds__(kThreads)
    row_dot_kernel(int64_t K, const T* __restrict__ x, int64_t x_stride, const T* __restrict__ w,
                   int64_t slot_stride, const int32_t* __restrict__ mapping, Epi epi) {
  const int64_t j = blockIdx.x;
  const int slot = mapping[j];
  if (slot < 0) return;
  const int n_out = epi.outputs(slot);
  const int o0 = int(blockIdx.y) * OPB;
  if (o0 >= n_out) return;
  const int n_here = min(OPB, n_out - o0);  // weight rows this block may read (true rank only)
  const T* xr = x + j * x_stride;
  const T* wr = w + int64_t(slot) * slot_stride + int64_t(o0) * K;

  float acc[OPB];
#pragma unroll
  for (int o = 0; o < OPB; ++o) acc[o] = 0.0f;

  if constexpr (VEC) {
    constexpr int E = elem::kVecElems<T>;
    constexpr int U = OPB >= 8 ? 1 : OPB >= 4 ? 2 : 4;  // independent 16-byte loads in flight
    const int64_t nch = K / E;
    for (int64_t c0 = threadIdx.x; c0 < nch; c0 += U * kThreads) {
      uint4 xv[U], wv[U][OPB];
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int64_t c = c0 + int64_t(u) * kThreads;
        const bool ok = c < nch;
        xv[u] = ok ? __ldg(reinterpret_cast<const uint4*>(xr) + c) : make_uint4(0, 0, 0, 0);
#pragma unroll
        for (int o = 0; o < OPB; ++o)
          wv[u][o] = ok && o < n_here ? __ldg(reinterpret_cast<const uint4*>(wr + o * K) + c)
                                      : make_uint4(0, 0, 0, 0);
      }
#pragma unroll
      for (int u = 0; u < U; ++u) {
        float xf[E];
        if constexpr (sizeof(T) == 4) elem::unpack(xv[u], xf);
        else elem::unpack<T>(xv[u], xf);
#pragma unroll
        for (int o = 0; o < OPB; ++o) {
          float wf[E];
          if constexpr (sizeof(T) == 4) elem::unpack(wv[u][o], wf);
          else elem::unpack<T>(wv[u][o], wf);
#pragma unroll
          for (int e = 0; e < E; ++e) acc[o] = fmaf(xf[e], wf[e], acc[o]);
        }
      }
    }
  } else {
    constexpr int U = 4;
    for (int64_t i0 = threadIdx.x; i0 < K; i0 += U * kThreads) {
      float xf[U], wf[U][OPB];
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int64_t i = i0 + int64_t(u) * kThreads;
        const bool ok = i < K;
        xf[u] = ok ? elem::load_ro(xr + i) : 0.0f;
#pragma unroll
        for (int o = 0; o < OPB; ++o) wf[u][o] = ok && o < n_here ? elem::load_ro(wr + o * K + i) : 0.0f;
      }
#pragma unroll
      for (int u = 0; u < U; ++u)
#pragma unroll
        for (int o = 0; o < OPB; ++o) acc[o] = fmaf(xf[u], wf[u][o], acc[o]);
    }
  }

  __shared__ float red[kThreads / 32][OPB];
#pragma unroll
  for (int o = 0; o < OPB; ++o) {
    float v = acc[o];
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
    acc[o] = v;
  }
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) {
#pragma unroll
    for (int o = 0; o < OPB; ++o) red[warp][o] = acc[o];
  }
  __syncthreads();
  if (threadIdx.x < n_here) {
    float s = 0.0f;
#pragma unroll
    for (int wi = 0; wi < kThreads / 32; ++wi) s += red[wi][threadIdx.x];
    epi.store(j, slot, o0 + int(threadIdx.x), s);
  }
}

// Host side: grid = (rows, ceil(max_outputs / OPB)); OPB from heuristics.h; 16-byte path when x,
// its row stride, W and K are all 16-byte aligned (otherwise element loads, e.g. hidden 2049).
template <class T, class Epi>
void launch(int64_t rows, int max_outputs, int64_t K, const T* x, int64_t x_stride, const T* w,
            int64_t slot_stride, const int32_t* mapping, const Epi& epi, cudaStream_t stream) {
  if (rows <= 0 || max_outputs <= 0) return;
  const int opb = pick_row_dot_opb(rows, max_outputs, current_sm_count());
  const int64_t groups = (max_outputs + opb - 1) / opb;
  PUNICA_REQUIRE(groups <= 65535 && rows < (int64_t(1) << 31), ErrorKind::usage,
                 "row_dot: too many outputs or rows");
  const bool vec = (K * int64_t(sizeof(T))) % 16 == 0 && (x_stride * int64_t(sizeof(T))) % 16 == 0 &&
                   reinterpret_cast<uintptr_t>(x) % 16 == 0 && reinterpret_cast<uintptr_t>(w) % 16 == 0 &&
                   (slot_stride * int64_t(sizeof(T))) % 16 == 0;
  const dim3 grid{unsigned(rows), unsigned(groups), 1u};
  auto by_vec = [&](auto opb_tag) {
    constexpr int OPB = decltype(opb_tag)::value;
    if (vec)
      row_dot_kernel<T, OPB, true, Epi><<<grid, kThreads, 0, stream>>>(K, x, x_stride, w, slot_stride, mapping, epi);
    else
      row_dot_kernel<T, OPB, false, Epi><<<grid, kThreads, 0, stream>>>(K, x, x_stride, w, slot_stride, mapping, epi);
    PUNICA_CUDA_CHECK_LAUNCH();
  };
  switch (opb) {
    case 1: by_vec(std::integral_constant<int, 1>{}); break;
    case 2: by_vec(std::integral_constant<int, 2>{}); break;
    case 4: by_vec(std::integral_constant<int, 4>{}); break;
    default: by_vec(std::integral_constant<int, 8>{}); break;
  }
}

}  // namespace punica::kernels::row_dot
