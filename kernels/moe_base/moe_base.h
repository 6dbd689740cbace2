// The base expert pipeline of vLLM's FusedMoE around cuBLAS (SPEC §4.1), for the MoE LoRA layer
// (apps/punica-bench/layers/moe_layer.cpp): the row gather/scatter that moves token and pair rows
// into expert-grouped order and back (with the routing weight on the way back), act_and_mul
// (SiLU-and-mul, halves or interleaved rows) and moe_sum. Memory-bound element passes.
#pragma once
#include <cstdint>
#include <cuda_runtime_api.h>
#include "kernels/common/dtype.h"

namespace punica::kernels {

// dst[i, 0:cols] = idx[i] < 0 ? 0 : round(w_i * src[idx[i], 0:cols]) for i < rows, with
// w_i = scale[i] when scale is given (fp32, indexed by the DESTINATION row), else 1 (a plain copy).
// Row strides ld_dst / ld_src in elements; dst and src must not overlap.
void launch_moe_gather_rows(void* dst, const void* src, const int32_t* idx, const float* scale, DType dtype,
                            int64_t rows, int64_t cols, int64_t ld_dst, int64_t ld_src, cudaStream_t stream);

// The expert activation, fp32 math on 16-bit inputs, one rounding (vLLM silu_and_mul):
//   MoeAct::gated_halves       out[i, c] = silu(in[i, c]) * in[i, I + c]       (in: [rows, 2I], [gate | up])
//   MoeAct::gated_interleaved  out[i, c] = silu(in[i, 2c]) * in[i, 2c + 1]     (GPT-OSS row interleave)
//   MoeAct::silu               out[i, c] = silu(in[i, c])                       (non-gated, in: [rows, I])
// silu(g) = g / (1 + exp(-g)). out: [rows, I] contiguous.
enum class MoeAct : int { gated_halves = 0, gated_interleaved = 1, silu = 2 };
void launch_moe_activation(void* out, const void* in, DType dtype, int64_t rows, int64_t inter, MoeAct act,
                           cudaStream_t stream);

// vLLM moe_sum: out[m, c] = round(sum_j in[m, j, c]) (fp32 accumulation in j order) for m < tokens.
void launch_moe_sum(void* out, const void* in, DType dtype, int64_t tokens, int top_k, int64_t cols,
                    cudaStream_t stream);

// The device pointer table of a cuBLAS grouped GEMM (cublasGemmGroupedBatchedEx reads its A/B/C
// arrays from device memory), written by a kernel whose parameters carry the pointers, so that the
// write is one graph-capturable launch with no host copy: table[i] = pack.p[i] for i < pack.n.
constexpr int kMoePtrPackMax = 480;  // pointers per launch (the pack fits the 4 KB of kernel parameters)
struct MoePtrPack {
  const void* p[kMoePtrPackMax] = {};
  int n = 0;
};
void launch_moe_write_pointers(void** table, const MoePtrPack& pack, cudaStream_t stream);

}  // namespace punica::kernels
