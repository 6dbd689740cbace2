// vLLM add_shrink / lora_shrink: y[s, t, :] = scale * A_s[slot(t)] @ x[t] for tokens with a slot,
// y[s, t, :] = 0 for tokens with slot -1 (shrink OVERWRITES the whole [S, T, max_rank] buffer).
// Work is proportional to each slot's true rank: columns j >= lora_ranks[slot] are written as 0
// and A's padding rows are never read.
#pragma once
#include <cstdint>
#include <cuda_runtime_api.h>
#include "kernels/common/dtype.h"
#include "kernels/common/lora_types.h"

namespace punica::kernels {

struct LoraShrinkArgs {
  DType dtype = DType::bf16;      // x and A
  DType out_dtype = DType::f32;   // y (fp32 by the chosen semantics; 16-bit allowed)
  int64_t num_tokens = 0;         // T
  int64_t hidden = 0;             // K
  const void* x = nullptr;        // [T, K], row stride x_row_stride elements
  int64_t x_row_stride = 0;
  int num_slices = 1;             // S <= kMaxSlices
  const void* lora_a[kMaxSlices] = {};  // each [L, max_rank, K] contiguous (vLLM [L,1,r,K])
  int max_loras = 0;              // L
  int max_rank = 0;               // r (padded)
  int num_active_loras = 0;       // 0 = unknown; else an upper bound on the distinct adapters the
                                  // batch uses (planned_loras, kernels/common/lora_types.h)
  const int32_t* lora_ranks = nullptr;  // [L] true rank per slot (0 = empty slot)
  LoraMetaView meta;              // token-level metadata
  float scale = 1.0f;
  void* y = nullptr;              // [S, T, max_rank] contiguous
};

// Some of its kernels are programmatic dependents of the kernel before them on `stream`: the
// metadata and lora_ranks (and lora_b) must not be written by that kernel (kernels/README.md, "Programmatic
// dependent launch"); x and y may be.
void launch_lora_shrink(const LoraShrinkArgs& args, cudaStream_t stream);

}  // namespace punica::kernels
