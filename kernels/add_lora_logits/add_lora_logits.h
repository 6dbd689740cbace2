// LogitsProcessorWithLoRA's add_lora_logits: for each sampled row j with request-level slot
// s_j >= 0, y[j, 0:V] += B[s_j] @ round_w(scale * A[s_j] @ x[j]). Rows with -1 untouched.
// Routing uses the PROMPT (sampler) metadata, not the token metadata. V up to 258048.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
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
// The kernels launch_add_lora_logits(a) runs: the row-dot shrink "row_dot/opb<outputs per block>",
// then "+pipe/bm64/bk16|bk64" (lora_expand's pipelined kernel) or "+sorted_expand/tm<rows>/th<columns>";
// the tiles from the current device's SM count (132 without a GPU). Host only.
std::string describe_add_lora_logits_plan(const AddLoraLogitsArgs& a);

}  // namespace punica::kernels
