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
constexpr int kStMinBlocks = 2;  // __launch_bounds__ min blocks per SM (register cap 128)
// Prefill kernel choice: true = staged (expand_mma_staged), false = the 64 x 128 fragment kernel.
constexpr bool kUseStagedPrefill = true;

inline bool use_mma(DType dtype, int64_t T, int max_rank, bool b_aligned) {
  return dtype != DType::f32 && T > kDecodeMaxTokens && max_rank % 8 == 0 && b_aligned;
}

}  // namespace punica::kernels::expand_heur
