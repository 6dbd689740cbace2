// Host-side launch configuration of lora_expand (vLLM add_expand): wide-N GEMV on CUDA cores for
// decode-sized batches; for prefill the staged mma.sync kernel (128 tokens of one adapter x 128
// output columns, y tile staged through shared memory with 16-byte coalesced accesses), the older
// fragment-epilogue mma kernel (64 x 128 tiles) kept as an alternative.
// Decided from static shapes only; no device value is read.
#pragma once
#include <cstdint>
#include "kernels/common/dtype.h"

namespace punica::kernels::expand_heur {

constexpr int kGemvThreads = 256;
constexpr int kGemvCols = 128;     // output columns per block
constexpr int kGemvTokens = 8;     // tokens sharing one load of B
constexpr int kMmaBM = 64, kMmaBN = 128, kMmaBK = 64, kMmaThreads = 128;
constexpr int64_t kDecodeMaxTokens = 128;
// Staged prefill kernel: BM tokens x BN columns per block, rank chunks of BK, 8 warps as 4 x 2
// (each 32 tokens x 64 columns); y row pitch in shared memory padded by 16 bytes.
constexpr int kStBM = 128, kStBN = 128, kStBK = 64, kStThreads = 256, kStYPitch = kStBN + 8;
// __launch_bounds__ min blocks per SM: 3 (register cap 80, ~120 B spill, 3 x 69.6 KB smem) measured
// 5-13% faster than 2 (cap 128, no spill) on H200 prefill shapes (T=8192, r=16/64, S=1/3); 3% slower
// only for r=64 with one adapter.
constexpr int kStMinBlocks = 3;
// Prefill kernel choice when the persistent kernel does not apply: true = staged
// (expand_mma_staged), false = the 64 x 128 fragment kernel.
constexpr bool kUseStagedPrefill = true;
// Persistent software-pipelined prefill kernel (expand_mma_persistent): one block of kPsThreads per
// SM loops over (adapter, token chunk, slice, column chunk) tiles; up to kPsMaxStages y tiles in
// flight through shared memory. Preconditions: 16-byte y rows / slice columns, 16-byte x and B,
// max_rank <= kPsMaxRank (x and B of a tile staged whole).
// Off: on H200 (T=8192, random adapter per token) it measured 0-8% slower than the staged kernel
// (r=16 S=1: 82.1 vs 78.3 us; S=3: 116.4 vs 114.4; r=64 32 adapters S=3: 148.4 vs 137.7; r=64 one
// adapter: 89.7 vs 92.2); deeper pipelining did not move the ~40%-of-floor plateau shared by all
// gather kernels. Selectable explicitly (ExpandPrefillKernel::mma_persistent*).
constexpr bool kUsePersistentPrefill = false;
constexpr int kPsThreads = 256, kPsMaxRank = 128, kPsMaxStages = 4, kPsMinStages = 3;
// Tile shape of the automatic choice: true = 64 tokens x 256 columns, false = 128 x 128.
constexpr bool kPsWide = false;

inline bool use_mma(DType dtype, int64_t T, int max_rank, bool b_aligned) {
  return dtype != DType::f32 && T > kDecodeMaxTokens && max_rank % 8 == 0 && b_aligned;
}

}  // namespace punica::kernels::expand_heur
