// VocabParallelEmbeddingWithLoRA's LoRA part: a[t] = A_stack[slot(t)][token_id[t]] (A stored
// transposed, row = token id), then add_lora_embedding: y[t] (+)= B[slot(t)] @ a[t] for tokens with
// a slot. Tokens with slot -1 are untouched. Only the true rank of each slot is read.
#pragma once
#include <cstdint>
#include <string>
#include <cuda_runtime_api.h>
#include "kernels/common/dtype.h"
#include "kernels/common/lora_types.h"

namespace punica::kernels {

struct AddLoraEmbeddingArgs {
  DType dtype = DType::bf16;      // A, B, y
  int64_t num_tokens = 0;
  const int32_t* token_ids = nullptr;   // [T], each in [0, vocab_size)
  int64_t vocab_size = 0;         // org vocab of the A table
  int64_t embed_dim = 0;          // D
  const void* lora_a = nullptr;   // [L, vocab_size, max_rank]
  const void* lora_b = nullptr;   // [L, D, max_rank]
  int max_loras = 0;
  int max_rank = 0;
  const int32_t* lora_ranks = nullptr;
  LoraMetaView meta;              // token-level
  void* y = nullptr;              // [T, >= D]
  int64_t y_row_stride = 0;
  bool add_inputs = true;
};

void launch_add_lora_embedding(const AddLoraEmbeddingArgs& args, cudaStream_t stream);
// The kernel launch_add_lora_embedding(a) runs: "pipe/bm64/bk16|bk64" (lora_expand's pipelined kernel
// with the A rows gathered per token) or "sorted_expand/tm<rows>/th<columns>" (the CUDA-core sorted
// expand; its tile from the current device's SM count, 132 without a GPU). Host only.
std::string describe_add_lora_embedding_plan(const AddLoraEmbeddingArgs& a);

}  // namespace punica::kernels
