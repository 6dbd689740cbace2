// Host-side launch configuration of lora_expand (vLLM add_expand): wide-N GEMV on CUDA cores for
// decode-sized batches, mma.sync tiles (64 tokens of one adapter x 128 output columns) for prefill.
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

inline bool use_mma(DType dtype, int64_t T, int max_rank, bool b_aligned) {
  return dtype != DType::f32 && T > kDecodeMaxTokens && max_rank % 8 == 0 && b_aligned;
}

}  // namespace punica::kernels::expand_heur
