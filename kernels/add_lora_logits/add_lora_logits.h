// LogitsProcessorWithLoRA's add_lora_logits: for each sampled row j with request-level slot
// s_j >= 0, y[j, 0:V] += B[s_j] @ round_w(scale * A[s_j] @ x[j]). Rows with -1 untouched.
// Routing uses the PROMPT (sampler) metadata, not the token metadata. V up to 258048.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cuda_runtime_api.h>
#include "kernels/common/dtype.h"
#include "kernels/common/lora_types.h"

namespace punica::kernels {

struct AddLoraLogitsArgs {
  DType dtype = DType::bf16;
  int64_t num_rows = 0;           // R
  int64_t hidden = 0;
  const void* x = nullptr;        // [R, hidden]
  int64_t x_row_stride = 0;
  const void* lora_a = nullptr;   // [L, max_rank, hidden]
  const void* lora_b = nullptr;   // [L, vocab_size, max_rank]
  int64_t vocab_size = 0;
  int max_loras = 0;
  int max_rank = 0;
  const int32_t* lora_ranks = nullptr;
  LoraMetaView meta;              // prompt/sampler-level
  float scale = 1.0f;
  void* y = nullptr;              // [R, >= vocab_size]
  int64_t y_row_stride = 0;
  void* workspace = nullptr;      // add_lora_logits_workspace_bytes(...)
};

std::size_t add_lora_logits_workspace_bytes(int64_t max_rows, int max_rank);
void launch_add_lora_logits(const AddLoraLogitsArgs& args, cudaStream_t stream);

}  // namespace punica::kernels
