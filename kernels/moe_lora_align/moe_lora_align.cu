// moe_lora_align_block_size on the device (SPEC §4.2): one block per entry of lora_ids; the block
// counts its slot's pairs per expert in shared memory, pads and scans the counts (CUB BlockScan),
// writes the sentinels and per-block experts, then scatters the pair ids with shared atomics
// (order inside a group unspecified, as in vLLM's large-batch kernel). Both passes walk tokens (a
// thread per token: its slot read once, its k expert ids only when the slot matches).
#include "kernels/moe_lora_align/moe_lora_align.h"

#include <cub/block/block_scan.cuh>
#include <algorithm>
#include <string>

#include "kernels/common/cuda_check.h"
#include "kernels/common/error.h"

namespace punica::kernels {
namespace {

constexpr int kThreads = 512;  // one block per slot: the whole batch through one SM
constexpr int kPerThread = (kMoeAlignMaxExperts + kThreads - 1) / kThreads;  // 2

struct AlignParams {
  int64_t numel;
  int top_k;
  const int32_t* topk_ids;
  const int32_t* map;
  int E;
  const int32_t* expert_map;
  int bs;
  int L;
  const int32_t* enabled;
  const int32_t* lora_ids;
  int64_t P, Q;
  int32_t* sorted;
  int32_t* expert_ids;
  int32_t* ntpp;
};

// Local expert of pair i, or -1 when the pair is dropped (id outside [0, E_k) or not on this rank).
__device__ __forceinline__ int local_expert(const AlignParams& p, int64_t i) {
  const int g = p.topk_ids[i];
  if (g < 0 || g >= p.E) return -1;
  return p.expert_map ? p.expert_map[g] : g;
}

__global__ void __launch_bounds__(kThreads) moe_lora_align_kernel(AlignParams p) {
  using Scan = cub::BlockScan<int, kThreads>;
  __shared__ typename Scan::TempStorage scan_tmp;
  __shared__ int cnt[kMoeAlignMaxExperts];
  __shared__ int cs[kMoeAlignMaxExperts + 1];
  const int entry = blockIdx.x;
  const int l = p.lora_ids ? p.lora_ids[entry] : entry;
  if (l < 0 || l >= p.L) return;
  if (p.enabled && p.enabled[l] == 0) return;
  for (int e = threadIdx.x; e < p.E; e += kThreads) cnt[e] = 0;
  __syncthreads();
  const int64_t M = p.numel / p.top_k;
  for (int64_t m = threadIdx.x; m < M; m += kThreads) {
    if (p.map[m] != l) continue;
    for (int j = 0; j < p.top_k; ++j) {
      const int e = local_expert(p, m * p.top_k + j);
      if (e >= 0 && e < p.E) atomicAdd(&cnt[e], 1);
    }
  }
  __syncthreads();
  // Exclusive scan of the padded counts, kPerThread consecutive experts per thread.
  int vals[kPerThread];
  int sum = 0;
#pragma unroll
  for (int q = 0; q < kPerThread; ++q) {
    const int e = threadIdx.x * kPerThread + q;
    vals[q] = e < p.E ? (cnt[e] + p.bs - 1) / p.bs * p.bs : 0;
    sum += vals[q];
  }
  int base = 0, total = 0;
  Scan(scan_tmp).ExclusiveSum(sum, base, total);
#pragma unroll
  for (int q = 0; q < kPerThread; ++q) {
    const int e = threadIdx.x * kPerThread + q;
    if (e < p.E) cs[e] = base;
    base += vals[q];
  }
  if (threadIdx.x == 0) {
    cs[p.E] = total;
    p.ntpp[l] = total;
  }
  __syncthreads();
  int32_t* sorted = p.sorted + int64_t(l) * p.P;
  int32_t* eids = p.expert_ids + int64_t(l) * p.Q;
  const int32_t sentinel = int32_t(p.numel);
  for (int64_t q = threadIdx.x; q < p.P; q += kThreads) sorted[q] = sentinel;
  const int64_t used_blocks = total / p.bs;
  for (int64_t b = threadIdx.x; b < p.Q; b += kThreads) {
    int e = -1;
    if (b < used_blocks) {  // the expert whose padded range holds b*bs (binary search over cs)
      const int pos = int(b * p.bs);
      int lo = 0, hi = p.E - 1;
      while (lo < hi) {
        const int mid = (lo + hi + 1) / 2;
        if (cs[mid] <= pos) lo = mid; else hi = mid - 1;
      }
      e = lo;
    }
    eids[b] = e;
  }
  // cnt becomes the fill cursor of each group.
  for (int e = threadIdx.x; e < p.E; e += kThreads) cnt[e] = 0;
  __syncthreads();
  for (int64_t m = threadIdx.x; m < M; m += kThreads) {
    if (p.map[m] != l) continue;
    for (int j = 0; j < p.top_k; ++j) {
      const int64_t i = m * p.top_k + j;
      const int e = local_expert(p, i);
      if (e < 0 || e >= p.E) continue;
      const int at = cs[e] + atomicAdd(&cnt[e], 1);
      if (at < p.P) sorted[at] = int32_t(i);  // P too small for the batch: never out of bounds
    }
  }
}

__global__ void moe_lora_align_naive_kernel(AlignParams p) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < p.numel;
       i += int64_t(gridDim.x) * blockDim.x)
    p.expert_ids[i] = local_expert(p, i);
}

}  // namespace

std::size_t moe_lora_align_workspace_bytes(int64_t, int, int, int) { return 0; }

void launch_moe_lora_align(const MoeLoraAlignArgs& a, cudaStream_t stream) {
  const char* op = "moe_lora_align: ";
  PUNICA_REQUIRE(a.num_tokens >= 0 && a.top_k >= 1 && a.max_loras >= 0, ErrorKind::usage,
                 std::string(op) + "bad sizes");
  PUNICA_REQUIRE(a.num_experts >= 1 && a.num_experts <= kMoeAlignMaxExperts, ErrorKind::usage,
                 std::string(op) + "num_experts outside [1, " + std::to_string(kMoeAlignMaxExperts) + "]");
  PUNICA_REQUIRE(a.block_size >= 1, ErrorKind::usage, std::string(op) + "block_size < 1");
  const int64_t numel = a.num_tokens * a.top_k;
  PUNICA_REQUIRE(numel < (int64_t(1) << 31), ErrorKind::usage, std::string(op) + "too many pairs");
  if (numel == 0 && a.naive) return;
  AlignParams p{numel, a.top_k, a.topk_ids, a.token_lora_mapping, a.num_experts, a.expert_map, a.block_size,
                a.max_loras, a.adapter_enabled, a.lora_ids, 0, 0, a.sorted_token_ids, a.expert_ids,
                a.num_tokens_post_pad};
  if (a.naive) {
    const int64_t blocks = std::min<int64_t>((numel + 255) / 256, 1024);
    moe_lora_align_naive_kernel<<<unsigned(blocks), 256, 0, stream>>>(p);
    PUNICA_CUDA_CHECK_LAUNCH();
    return;
  }
  const MoeLoraAlignSizes sz = moe_lora_align_sizes(numel, a.num_experts, a.block_size, a.pad_sorted_ids);
  p.P = a.max_padded > 0 ? a.max_padded : sz.max_padded;
  p.Q = (p.P + a.block_size - 1) / a.block_size;
  if (a.max_loras == 0 || p.P == 0) return;
  PUNICA_REQUIRE(a.sorted_token_ids && a.expert_ids && a.num_tokens_post_pad && (numel == 0 || (a.topk_ids && a.token_lora_mapping)),
                 ErrorKind::usage, std::string(op) + "null buffer");
  const int entries = a.lora_ids ? a.max_loras + 1 : a.max_loras;
  moe_lora_align_kernel<<<entries, kThreads, 0, stream>>>(p);
  PUNICA_CUDA_CHECK_LAUNCH();
}

}  // namespace punica::kernels
