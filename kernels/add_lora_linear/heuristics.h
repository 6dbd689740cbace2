// Host-side path choice of add_lora_linear: decode-sized batches run the split-K shrink into
// per-split partials (no memset, no atomics) chained by programmatic dependent launch into the
// wide-N expand that sums them; larger batches run shrink -> expand through an fp32 [S,T,r] buffer.
#pragma once
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include "kernels/lora_shrink/heuristics.h"

namespace punica::kernels::linear_heur {

constexpr int64_t kDecodeMaxTokens = 128;

inline bool use_partials(int64_t T) { return T <= kDecodeMaxTokens; }

inline std::size_t workspace_bytes(int64_t max_tokens, int S, int R) {
  const std::size_t full = std::size_t(S) * std::size_t(std::max<int64_t>(max_tokens, 0)) * R * 4;
  const std::size_t part = std::size_t(shrink_heur::kMaxSplits) * S *
                           std::size_t(std::min<int64_t>(std::max<int64_t>(max_tokens, 0), kDecodeMaxTokens)) * R * 4;
  return std::max(full, part);
}

}  // namespace punica::kernels::linear_heur
