// LoRAKernelMeta.prepare_tensors on the device, graph-capturable (no host sync, no allocation).
// A counting sort on key = slot + 1 (L+1 bins, -1 first), stable because each chunk of kChunk
// tokens is ordered by cub::BlockRadixSort (stable) and the chunks' offsets come from one exclusive
// scan over the bin-major [bin][chunk] count matrix. T <= kChunk: one block does everything.
#include "kernels/lora_meta/lora_meta.h"

#include <algorithm>

#include <cub/block/block_radix_sort.cuh>
#include <cub/block/block_scan.cuh>

#include "kernels/common/cuda_check.h"
#include "kernels/common/error.h"

namespace punica::kernels {
namespace {

constexpr int kThreads = 512;
constexpr int kItems = 4;
constexpr int kChunk = kThreads * kItems;  // tokens per block
constexpr int kMaxLoras = 2048;            // bins live in shared memory

using BlockSort = cub::BlockRadixSort<uint32_t, kThreads, kItems, int32_t>;
using BlockScan = cub::BlockScan<int32_t, kThreads>;

struct Outs {
  int32_t* mapping;
  int32_t* sorted;
  int32_t* active;
  int32_t* counts;
  int32_t* start;
  int32_t* no_lora;
  int32_t* num_active;
};

__host__ __device__ inline int key_bits(int L) {  // bits of the largest key, L + 1 (the pad key)
  int b = 1;
  while ((1u << b) <= unsigned(L + 1)) ++b;
  return b;
}

__device__ __forceinline__ uint32_t to_key(int32_t slot, int L) {
  // Out-of-contract values are clamped so shared-memory bins stay in range.
  return uint32_t(min(max(slot + 1, 0), L));
}

// Load chunk `c` (blocked: thread t holds tokens c*kChunk + t*kItems + i), copy the mapping,
// sort stably by key. Pads get key L+1 and sort last.
__device__ __forceinline__ void load_and_sort(const int32_t* in, int64_t T, int L, int64_t c,
                                              int32_t* mapping_out, BlockSort::TempStorage& tmp,
                                              uint32_t (&keys)[kItems], int32_t (&vals)[kItems]) {
#pragma unroll
  for (int i = 0; i < kItems; ++i) {
    const int64_t t = c * kChunk + int64_t(threadIdx.x) * kItems + i;
    if (t < T) {
      const int32_t s = in[t];
      if (mapping_out) mapping_out[t] = s;
      keys[i] = to_key(s, L);
      vals[i] = int32_t(t);
    } else {
      keys[i] = uint32_t(L + 1);
      vals[i] = -1;
    }
  }
  BlockSort(tmp).Sort(keys, vals, 0, key_bits(L));
}

// From per-bin totals and global starts (shared memory, L+1 bins): the compacted active list,
// counts, start locations with their -1/0 tails, the no-LoRA flag and the active count.
__device__ void finalize(const int32_t* bin_count, const int32_t* bin_start, int64_t T, int L,
                         const Outs& o, BlockScan::TempStorage& scan_tmp) {
  const int bins = L + 1;
  int32_t running = 0;  // present bins before this tile
  for (int base = 0; base < bins; base += kThreads) {
    const int b = base + int(threadIdx.x);
    const int32_t present = (b < bins && bin_count[b] > 0) ? 1 : 0;
    int32_t q, tile_total;
    BlockScan(scan_tmp).ExclusiveSum(present, q, tile_total);
    q += running;
    if (present) {
      if (o.active) o.active[q] = b - 1;
      if (o.counts) o.counts[q] = bin_count[b];
      if (o.start) o.start[q + 1] = bin_start[b] + bin_count[b];
    }
    running += tile_total;
    __syncthreads();  // scan_tmp reuse
  }
  const int n_active = running;
  for (int q = n_active + int(threadIdx.x); q < bins; q += kThreads) {
    if (o.active) o.active[q] = -1;
    if (o.counts) o.counts[q] = 0;
    if (o.start) o.start[q + 1] = 0;
  }
  if (threadIdx.x == 0) {
    if (o.start) o.start[0] = 0;
    if (o.num_active) *o.num_active = n_active;
    if (o.no_lora) *o.no_lora = (T == 0 || bin_count[0] == T) ? 1 : 0;
  }
}

// T <= kChunk: sort, read bin boundaries off the sorted keys, finalize. One launch.
__global__ void __launch_bounds__(kThreads) lora_meta_single_kernel(const int32_t* in, int64_t T, int L, Outs o) {
  __shared__ union {
    BlockSort::TempStorage sort;
    uint32_t keys[kChunk];
    BlockScan::TempStorage scan;
  } sm;
  extern __shared__ int32_t bins_dyn[];  // [2 * (L+1)]: start, count
  int32_t* bin_start = bins_dyn;
  int32_t* bin_count = bins_dyn + (L + 1);
  for (int b = threadIdx.x; b <= L; b += kThreads) { bin_start[b] = 0; bin_count[b] = 0; }

  uint32_t keys[kItems];
  int32_t vals[kItems];
  load_and_sort(in, T, L, 0, o.mapping, sm.sort, keys, vals);
  __syncthreads();
#pragma unroll
  for (int i = 0; i < kItems; ++i) sm.keys[threadIdx.x * kItems + i] = keys[i];
  __syncthreads();
#pragma unroll
  for (int i = 0; i < kItems; ++i) {
    const int p = threadIdx.x * kItems + i;
    if (p < T) {
      if (o.sorted) o.sorted[p] = vals[i];
      if (p == 0 || sm.keys[p - 1] != keys[i]) bin_start[keys[i]] = p;
      if (p == T - 1 || sm.keys[p + 1] != keys[i]) bin_count[keys[i]] = p + 1;  // end for now
    }
  }
  __syncthreads();
  for (int b = threadIdx.x; b <= L; b += kThreads)
    if (bin_count[b] > 0) bin_count[b] -= bin_start[b];
  __syncthreads();
  finalize(bin_count, bin_start, T, L, o, sm.scan);
}

// Pass 1: per-chunk histogram into ws[bin * nb + chunk]; copies the mapping.
__global__ void __launch_bounds__(kThreads) lora_meta_hist_kernel(const int32_t* in, int64_t T, int L, int32_t* mapping_out,
                                      int32_t* ws) {
  extern __shared__ int32_t hist[];  // [L+1]
  for (int b = threadIdx.x; b <= L; b += kThreads) hist[b] = 0;
  __syncthreads();
  const int64_t c = blockIdx.x;
#pragma unroll
  for (int i = 0; i < kItems; ++i) {
    const int64_t t = c * kChunk + int64_t(i) * kThreads + threadIdx.x;  // coalesced
    if (t < T) {
      const int32_t s = in[t];
      if (mapping_out) mapping_out[t] = s;
      atomicAdd(&hist[to_key(s, L)], 1);
    }
  }
  __syncthreads();
  const int64_t nb = gridDim.x;
  for (int b = threadIdx.x; b <= L; b += kThreads) ws[b * nb + c] = hist[b];
}

// Pass 2 (one block): exclusive scan of the count matrix in place -> the first output position of
// each (bin, chunk); per-bin totals and starts; finalize.
__global__ void __launch_bounds__(kThreads) lora_meta_scan_kernel(int32_t* ws, int64_t nb, int64_t T, int L, Outs o) {
  __shared__ BlockScan::TempStorage scan_tmp;
  extern __shared__ int32_t bins_dyn[];
  int32_t* bin_start = bins_dyn;
  int32_t* bin_count = bins_dyn + (L + 1);
  const int64_t n = int64_t(L + 1) * nb;
  int32_t running = 0;
  for (int64_t base = 0; base < n; base += int64_t(kThreads) * kItems) {
    int32_t v[kItems];
#pragma unroll
    for (int i = 0; i < kItems; ++i) {
      const int64_t e = base + int64_t(threadIdx.x) * kItems + i;
      v[i] = e < n ? ws[e] : 0;
    }
    int32_t ex[kItems], total;
    BlockScan(scan_tmp).ExclusiveSum(v, ex, total);
#pragma unroll
    for (int i = 0; i < kItems; ++i) {
      const int64_t e = base + int64_t(threadIdx.x) * kItems + i;
      if (e < n) ws[e] = ex[i] + running;
    }
    running += total;
    __syncthreads();
  }
  for (int b = threadIdx.x; b <= L; b += kThreads) {
    const int32_t s = ws[int64_t(b) * nb];
    const int32_t e = b < L ? ws[int64_t(b + 1) * nb] : int32_t(T);
    bin_start[b] = s;
    bin_count[b] = e - s;
  }
  __syncthreads();
  finalize(bin_count, bin_start, T, L, o, scan_tmp);
}

// Pass 3: each chunk sorts itself stably and scatters to its (bin, chunk) offsets.
__global__ void __launch_bounds__(kThreads) lora_meta_scatter_kernel(const int32_t* in, int64_t T, int L, const int32_t* ws,
                                         int32_t* sorted) {
  __shared__ union {
    BlockSort::TempStorage sort;
    uint32_t keys[kChunk];
  } sm;
  extern __shared__ int32_t local_start[];  // [L+2]
  const int64_t c = blockIdx.x, nb = gridDim.x;
  uint32_t keys[kItems];
  int32_t vals[kItems];
  load_and_sort(in, T, L, c, nullptr, sm.sort, keys, vals);
  __syncthreads();
#pragma unroll
  for (int i = 0; i < kItems; ++i) sm.keys[threadIdx.x * kItems + i] = keys[i];
  __syncthreads();
#pragma unroll
  for (int i = 0; i < kItems; ++i) {
    const int p = threadIdx.x * kItems + i;
    if (p == 0 || sm.keys[p - 1] != keys[i]) local_start[keys[i]] = p;
  }
  __syncthreads();
#pragma unroll
  for (int i = 0; i < kItems; ++i) {
    const int p = threadIdx.x * kItems + i;
    if (keys[i] <= uint32_t(L))
      sorted[ws[int64_t(keys[i]) * nb + c] + (p - local_start[keys[i]])] = vals[i];
  }
}

int64_t num_chunks(int64_t T) { return (T + kChunk - 1) / kChunk; }

}  // namespace

std::size_t lora_meta_workspace_bytes(int64_t max_tokens, int max_loras) {
  const int64_t nb = std::max<int64_t>(1, num_chunks(std::max<int64_t>(0, max_tokens)));
  const std::size_t n = std::size_t(std::max(0, max_loras) + 1) * std::size_t(nb);
  return (n * sizeof(int32_t) + 255) / 256 * 256;
}

void launch_lora_meta(const LoraMetaArgs& a, cudaStream_t stream) {
  const int64_t T = a.num_tokens;
  const int L = a.max_loras;
  PUNICA_REQUIRE(T >= 0 && L >= 0, ErrorKind::usage, "lora_meta: negative num_tokens or max_loras");
  PUNICA_REQUIRE(L <= kMaxLoras, ErrorKind::usage, "lora_meta: max_loras above 2048");
  PUNICA_REQUIRE(T < (int64_t(1) << 31) - kChunk, ErrorKind::usage, "lora_meta: too many tokens");
  PUNICA_REQUIRE(T == 0 || a.token_lora_mapping_in, ErrorKind::usage,
                 "lora_meta: token_lora_mapping_in is null");
  const Outs o{a.token_lora_mapping, a.sorted_token_ids, a.active_lora_ids, a.num_tokens_per_lora,
               a.lora_token_start_loc, a.no_lora_flag, a.num_active};
  const std::size_t bins2 = 2 * std::size_t(L + 1) * sizeof(int32_t);
  if (T <= kChunk) {
    lora_meta_single_kernel<<<1, kThreads, bins2, stream>>>(a.token_lora_mapping_in, T, L, o);
    PUNICA_CUDA_CHECK_LAUNCH();
    return;
  }
  const int64_t nb = num_chunks(T);
  PUNICA_REQUIRE(a.workspace && a.workspace_bytes >= lora_meta_workspace_bytes(T, L),
                 ErrorKind::usage, "lora_meta: workspace missing or smaller than lora_meta_workspace_bytes");
  int32_t* ws = static_cast<int32_t*>(a.workspace);
  lora_meta_hist_kernel<<<unsigned(nb), kThreads, std::size_t(L + 1) * sizeof(int32_t), stream>>>(
      a.token_lora_mapping_in, T, L, a.token_lora_mapping, ws);
  PUNICA_CUDA_CHECK_LAUNCH();
  lora_meta_scan_kernel<<<1, kThreads, bins2, stream>>>(ws, nb, T, L, o);
  PUNICA_CUDA_CHECK_LAUNCH();
  if (a.sorted_token_ids) {
    lora_meta_scatter_kernel<<<unsigned(nb), kThreads, std::size_t(L + 2) * sizeof(int32_t), stream>>>(
        a.token_lora_mapping_in, T, L, ws, a.sorted_token_ids);
    PUNICA_CUDA_CHECK_LAUNCH();
  }
}

std::string describe_lora_meta_plan(const LoraMetaArgs& a) {
  if (a.num_tokens <= kChunk) return "single";
  return "chunked/nb" + std::to_string(num_chunks(a.num_tokens)) + (a.sorted_token_ids ? "" : "/nosort");
}

}  // namespace punica::kernels
