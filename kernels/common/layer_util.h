// Small device helpers of the TP LoRA layers (apps/punica-bench/layers): the base layer's bias add
// (vLLM adds it inside the base GEMM; cuBLAS GemmEx has no bias, so it is a separate pass) and
// VocabParallelEmbedding's masked lookup of the rank's vocabulary shard.
#pragma once
#include <cstdint>
#include <cuda_runtime_api.h>
#include "kernels/common/dtype.h"

namespace punica::kernels {

// y[i, c] = round(y[i, c] + bias[c]) for i < rows, c < cols (row stride ldy elements).
void launch_add_bias(void* y, const void* bias, DType dtype, int64_t rows, int64_t cols, int64_t ldy,
                     cudaStream_t stream);

// y[t, :] = table[ids[t] - vocab_begin, :] when vocab_begin <= ids[t] < vocab_end, else 0
// (table = the rank's rows [vocab_begin, vocab_end) of the embedding, [vocab_end - vocab_begin, dim]).
void launch_embedding_lookup(void* y, const void* table, const int32_t* ids, DType dtype,
                             int64_t num_tokens, int64_t dim, int64_t vocab_begin, int64_t vocab_end,
                             int64_t ldy, cudaStream_t stream);

}  // namespace punica::kernels
