// FlashInfer's MoE LoRA deltas (SPEC §4.8.4-4.8.5) for any shape: bgmv_moe_gemm1_lora_delta, the FC1
// (gate_up) delta per (token t, routed slot j), unweighted, [T, k, 2I], which TRT-LLM's MoE adds
// pre-SwiGLU as `gemm1_lora_delta`; and bgmv_moe_gemm2_lora_delta, the FC2 delta of the permuted
// post-activation rows, routing-weighted and summed over each token's slots, [T, H]. Weights are
// reached through FlashInfer's int64 pointer tables (fill_w_ptr, §4.8.1).
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <cuda_runtime_api.h>
#include "kernels/common/dtype.h"

namespace punica::kernels {

constexpr int kBgmvMoeMaxRank = 512;  // rank (= the tables' rank dim) limit of the kernels

// Dtypes: `lora_dtype` is the dtype of the weights, of x / act (FlashInfer casts x to lora_dtype
// first; here it must already be in it) and of the rank-r intermediate (rounded to it, as FlashInfer's
// shrink stores it); fp16 or bf16, default bf16 as FlashInfer. `out_dtype`: bf16 (FlashInfer's
// default), fp16 or fp32; the delta is summed in fp32, times `scale` (default 1.0), rounded once.

// ---- gemm1: delta[t, j] = scale * [B_gate[l,e] round(A_gate[l,e] x[t]) | B_up[l,e] round(A_up[l,e] x[t])]
// (regular), or scale * B_fused[l,e] round(A[l,e] x[t]) (shared-A, FlashInfer's "performant" mode),
// l = lora_ids[t], e = topk_ids[t, j]; rows of tokens with l < 0 (or an expert id outside [0, E))
// are exactly 0. Every [T, k, 2I] element is written.
//
// Pointer tables (fill_w_ptr): element (slice s, expert e) is the byte address of W[0, e] for the
// stacked W [L, E, a, b] (a stride-0 expert dim = every entry the same address: a shared LoRA);
// adapter l's [a, b] matrix (row-major, row stride b) starts lora_stride elements * l further.
// Regular mode: tables [2, E] (row 0 gate, row 1 up), A [.., rank, H], B [.., I, rank].
// Shared-A mode: tables [E], A [.., rank, H], B [.., 2I, rank] (rows 0:I gate, I:2I up).
struct BgmvMoeGemm1Args {
  DType lora_dtype = DType::bf16;
  DType out_dtype = DType::bf16;
  float scale = 1.0f;
  int64_t num_tokens = 0;                // T (0 = no-op)
  int top_k = 1;                         // k
  int64_t hidden = 0;                    // H
  int64_t intermediate = 0;              // I
  int num_experts = 0;                   // E (the tables' expert dim)
  int max_loras = 0;                     // L: lora_ids in [-1, L)
  int rank = 0;                          // the tables' rank dim (A rows, B columns)
  const int32_t* lora_ranks = nullptr;   // [L] true rank per slot (<= rank; null = rank): work ∝ it
  bool shared_a = false;                 // FlashInfer's performant mode ([E] tables, B fused [2I, rank])
  const int64_t* w_ptr_a = nullptr;      // [2, E] (regular) or [E] (shared-A), byte addresses
  const int64_t* w_ptr_b = nullptr;
  int64_t lora_stride_a = 0;             // elements between adapters (A)
  int64_t lora_stride_b = 0;             // elements between adapters (B)
  const void* x = nullptr;               // hidden_states [T, H] in lora_dtype, row stride H
  const int32_t* topk_ids = nullptr;     // [T, k]
  const int32_t* lora_ids = nullptr;     // [T] slot per token, < 0 = none
  void* out = nullptr;                   // [T, k, 2I] in out_dtype; pair p = t*k + j at row p, stride ld_out
  int64_t ld_out = 0;                    // 0 = 2I
  void* workspace = nullptr;             // bgmv_moe_gemm1_workspace_bytes(...)
  std::size_t workspace_bytes = 0;
};

// ---- gemm2: delta[t] = scale * sum_j w[t, j] * B[l,e] round(A[l,e] act[perm[t*k + j]])
// over the slots with perm >= 0, l = lora_ids[t] >= 0, e = topk_ids[t, j] in [0, E); every [T, H]
// row is written (0 where no slot contributes). Tables [E] (FlashInfer's [1, E]): A [.., rank, I],
// B [.., H, rank].
struct BgmvMoeGemm2Args {
  DType lora_dtype = DType::bf16;
  DType out_dtype = DType::bf16;
  float scale = 1.0f;
  int64_t num_tokens = 0;                // T
  int top_k = 1;
  int64_t hidden = 0;                    // H: output width (B rows)
  int64_t intermediate = 0;              // I: act width (A columns)
  int num_experts = 0;
  int max_loras = 0;
  int rank = 0;
  const int32_t* lora_ranks = nullptr;
  const int64_t* w_ptr_a = nullptr;      // [E]
  const int64_t* w_ptr_b = nullptr;      // [E]
  int64_t lora_stride_a = 0, lora_stride_b = 0;
  const void* act = nullptr;             // [act_rows, I] permuted post-activation rows, lora_dtype
  int64_t act_rows = 0;                  // perm entries must be < act_rows
  const int32_t* perm = nullptr;         // expanded_idx_to_permuted_idx [T*k], < 0 = inactive slot
  const int32_t* topk_ids = nullptr;     // [T, k]
  const float* topk_weights = nullptr;   // [T, k] fp32
  const int32_t* lora_ids = nullptr;     // [T]
  void* out = nullptr;                   // [T, H] out_dtype, row stride ld_out
  int64_t ld_out = 0;                    // 0 = H
  void* workspace = nullptr;             // bgmv_moe_gemm2_workspace_bytes(...)
  std::size_t workspace_bytes = 0;
};

// The kernel plan of a call, from static shapes only (T, k, E, L, rank, widths; heuristics.h).
enum class BgmvMoePath : int {
  pairs = 0,    // decode: shrink a warp per rank row per (pair, slice) -> column-tiled expand
  grouped = 1,  // prefill: pairs grouped by (adapter, expert) (moe_lora_align), mma.sync tiles
};
struct BgmvMoePlan {
  BgmvMoePath path = BgmvMoePath::pairs;
  int block_m = 16;  // grouped: pairs per tile (the alignment's block size)
  int k_split = 1;   // grouped: blocks splitting the shrink's K per alignment block (fp32 atomics)
  int col_split = 1; // grouped: blocks splitting the expand's column tiles per alignment block
};
}  // namespace punica::kernels

// plan_bgmv_moe_gemm{1,2} (the choice rule), describe_bgmv_moe_gemm{1,2}_plan and the shape
// checks bgmv_moe_gemm{1,2}_arg_error, host-inline (the references and the bench read them too).
#include "kernels/bgmv_moe_lora_delta/heuristics.h"

namespace punica::kernels {

// Workspace bytes of a call with these shapes (the plan's buffers: pairs path the rank-r
// intermediate [S, T*k, rank] in lora_dtype; grouped path the routing of moe_lora_align, the fp32
// intermediate [T*k, S*round16(rank)] and gemm2's fp32 accumulator [T, H]); allocate once, before any call.
std::size_t bgmv_moe_gemm1_workspace_bytes(const BgmvMoeGemm1Args& a);
std::size_t bgmv_moe_gemm2_workspace_bytes(const BgmvMoeGemm2Args& a);

// Asynchronous on `stream`; no host synchronisation or allocation (graph capturable). T = 0 is a
// no-op. Throws punica::Error(usage) on bad arguments (naming the field), runtime on CUDA errors.
void launch_bgmv_moe_gemm1_lora_delta(const BgmvMoeGemm1Args& a, cudaStream_t stream);
void launch_bgmv_moe_gemm2_lora_delta(const BgmvMoeGemm2Args& a, cudaStream_t stream);

}  // namespace punica::kernels
