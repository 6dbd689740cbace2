// Wide-N expand over rows sorted by adapter slot (LoRAKernelMeta order), shared by
// add_lora_embedding (rows = tokens, input = the gathered A row) and add_lora_logits (rows =
// sampled rows, input = the shrink result): y[row, n] (+)= round_w(sum_{k<r_s} in[row][k] * B[s][n][k]).
// A block owns TM consecutive sorted rows and blockDim.x columns; each run of equal slots inside
// the tile reads its B rows once (16-byte loads along the rank) and applies them to every row of
// the run. Only the true rank r_s is read; rows of slot -1 are never touched.
#pragma once
#include <cstdint>
#include <type_traits>

#include "kernels/add_lora_embedding/lora_elem.cuh"

namespace punica::kernels::sorted_expand {

// Where the rank-r input of a row comes from.
template <class T>
struct GatherRows {  // embedding: in[row][k] = A[slot][token_ids[row]][k]
  const T* lora_a;   // [L, vocab, max_rank]
  const int32_t* token_ids;
  int64_t vocab;
  __device__ __forceinline__ float load(int64_t row, int slot, int k, int max_rank) const {
    const int32_t id = token_ids[row];
    if (id < 0 || id >= vocab) return 0.0f;  // out of contract: contribute nothing, never fault
    return elem::load_ro(lora_a + (int64_t(slot) * vocab + id) * max_rank + k);
  }
};
struct BufferRows {  // logits: in[row][k] = u[row * max_rank + k] (fp32, already rounded)
  const float* u;
  __device__ __forceinline__ float load(int64_t row, int slot, int k, int max_rank) const {
    return __ldg(u + row * max_rank + k);
  }
};

struct Params {
  int64_t num_rows;
  const int32_t* sorted_rows;  // [num_rows]
  const int32_t* mapping;      // [num_rows] slot of each row
  const int32_t* ranks;        // [L] or null (= max_rank)
  int max_rank;
  int64_t n_cols;              // N (width of B and of the y update)
  void* y;
  int64_t y_stride;
  bool add_inputs;
};

// Row stride of the staged inputs in shared memory (float4-aligned rows).
__host__ __device__ constexpr int staged_stride(int max_rank) { return (max_rank + 3) & ~3; }

// Dynamic shared memory: TM * staged_stride(max_rank) floats.
template <class T, int TM, bool VEC, class Src>
__global__ void __launch_bounds__(256, 2) sorted_expand_kernel(Params p, const T* __restrict__ lora_b,
                                                            Src src) {
  __shared__ int s_row[TM];
  __shared__ int s_slot[TM];
  __shared__ int s_rank[TM];
  extern __shared__ float4 s_in4[];  // [TM][RP]
  float* s_in = reinterpret_cast<float*>(s_in4);

  const int64_t first = int64_t(blockIdx.x) * TM;
  const int cnt = p.num_rows - first < TM ? int(p.num_rows - first) : TM;
  if (threadIdx.x < TM) {
    int row = 0, slot = -1, rank = 0;
    if (int(threadIdx.x) < cnt) {
      row = p.sorted_rows[first + threadIdx.x];
      slot = p.mapping[row];
      if (slot >= 0) rank = p.ranks ? p.ranks[slot] : p.max_rank;
    }
    s_row[threadIdx.x] = row;
    s_slot[threadIdx.x] = slot;
    s_rank[threadIdx.x] = rank;
  }
  __syncthreads();
  // Sorted ascending: if the last row of the tile has no adapter, none has.
  if (s_slot[cnt - 1] < 0) return;

  const int R = p.max_rank;
  const int RP = staged_stride(R);
  for (int i = threadIdx.x; i < TM * RP; i += blockDim.x) {
    const int t = i / RP, k = i - t * RP;
    float v = 0.0f;
    if (t < cnt && s_slot[t] >= 0 && k < s_rank[t]) v = src.load(s_row[t], s_slot[t], k, R);
    s_in[i] = v;
  }
  __syncthreads();

  const int64_t n = int64_t(blockIdx.y) * blockDim.x + threadIdx.x;
  if (n >= p.n_cols) return;
  T* y = static_cast<T*>(p.y);

  int i0 = 0;
  while (i0 < cnt && s_slot[i0] < 0) ++i0;
  while (i0 < cnt) {
    const int slot = s_slot[i0];
    int i1 = i0 + 1;
    while (i1 < cnt && s_slot[i1] == slot) ++i1;
    const int r = s_rank[i0];
    const T* b = lora_b + (int64_t(slot) * p.n_cols + n) * R;

    // The y rows of the run are read first (all loads before any store: no load-after-store
    // serialisation through possible aliasing), overlapping the B loads below.
    float acc[TM], base[TM];
#pragma unroll
    for (int t = 0; t < TM; ++t) {
      acc[t] = 0.0f;
      base[t] = 0.0f;
      if (p.add_inputs && t >= i0 && t < i1) base[t] = elem::to_f(y[int64_t(s_row[t]) * p.y_stride + n]);
    }
    int k = 0;
    if constexpr (VEC) {
      // G independent 16-byte loads in flight per group (rank 64 fp16/bf16, 16 fp32 per group).
      constexpr int E = elem::kVecElems<T>, G = sizeof(T) == 4 ? 4 : 8;
      const int kv = (r / E) * E;
      for (int k0 = 0; k0 < kv; k0 += G * E) {
        uint4 raw[G];
#pragma unroll
        for (int g = 0; g < G; ++g)
          raw[g] = k0 + g * E < kv ? __ldg(reinterpret_cast<const uint4*>(b + k0 + g * E))
                                   : make_uint4(0, 0, 0, 0);
#pragma unroll
        for (int g = 0; g < G; ++g) {
          const int kk = k0 + g * E;
          if (kk >= kv) break;
          float w[E];
          if constexpr (sizeof(T) == 4) elem::unpack(raw[g], w);
          else elem::unpack<T>(raw[g], w);
#pragma unroll
          for (int t = 0; t < TM; ++t) {
            if (t >= i0 && t < i1) {
              const float4* in = reinterpret_cast<const float4*>(s_in + t * RP + kk);
#pragma unroll
              for (int e = 0; e < E; e += 4) {
                const float4 a = in[e / 4];
                acc[t] = fmaf(a.x, w[e], acc[t]);
                acc[t] = fmaf(a.y, w[e + 1], acc[t]);
                acc[t] = fmaf(a.z, w[e + 2], acc[t]);
                acc[t] = fmaf(a.w, w[e + 3], acc[t]);
              }
            }
          }
        }
      }
      k = kv;
    }
    for (; k < r; ++k) {
      const float w = elem::load_ro(b + k);
#pragma unroll
      for (int t = 0; t < TM; ++t)
        if (t >= i0 && t < i1) acc[t] = fmaf(s_in[t * RP + k], w, acc[t]);
    }
#pragma unroll
    for (int t = 0; t < TM; ++t) {
      if (t >= i0 && t < i1) {
        const float delta = elem::round_w<T>(acc[t]);
        y[int64_t(s_row[t]) * p.y_stride + n] = elem::from_f<T>(p.add_inputs ? base[t] + delta : delta);
      }
    }
    i0 = i1;
  }
}

}  // namespace punica::kernels::sorted_expand

#include "kernels/add_lora_embedding/heuristics.h"
#include "kernels/common/cuda_check.h"

namespace punica::kernels::sorted_expand {

// Host side: picks the tile (heuristics.h), the vector path, and launches on `stream`.
template <class T, class Src>
void launch(const Params& p, const T* lora_b, const Src& src, cudaStream_t stream) {
  if (p.num_rows <= 0 || p.n_cols <= 0) return;
  const SortedExpandConfig cfg = pick_sorted_expand_config(p.num_rows, p.n_cols, current_sm_count());
  const bool vec = (int64_t(p.max_rank) * int64_t(sizeof(T))) % 16 == 0 &&
                   reinterpret_cast<uintptr_t>(lora_b) % 16 == 0;
  const int64_t col_tiles = (p.n_cols + cfg.threads - 1) / cfg.threads;
  PUNICA_REQUIRE(col_tiles <= 65535, ErrorKind::usage, "sorted expand: too many columns");
  const dim3 grid{unsigned((p.num_rows + cfg.tm - 1) / cfg.tm), unsigned(col_tiles), 1u};
  const std::size_t smem = std::size_t(cfg.tm) * staged_stride(p.max_rank) * sizeof(float);
  auto go = [&](auto kernel) {
    kernel<<<grid, cfg.threads, smem, stream>>>(p, lora_b, src);
    PUNICA_CUDA_CHECK_LAUNCH();
  };
  auto by_vec = [&](auto tm_tag) {
    constexpr int TM = decltype(tm_tag)::value;
    if (vec) go(sorted_expand_kernel<T, TM, true, Src>);
    else go(sorted_expand_kernel<T, TM, false, Src>);
  };
  switch (cfg.tm) {
    case 4: by_vec(std::integral_constant<int, 4>{}); break;
    case 8: by_vec(std::integral_constant<int, 8>{}); break;
    default: by_vec(std::integral_constant<int, 16>{}); break;
  }
}

}  // namespace punica::kernels::sorted_expand
