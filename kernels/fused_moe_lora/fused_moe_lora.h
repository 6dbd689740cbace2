// vLLM add_lora_fused_moe / fused_moe_lora (SPEC §4.3-4.4, A.6): for every (token m, routed slot j)
// pair i = m*k + j whose token has an enabled adapter l and whose expert e is a valid local one,
//   y[i, offset + s*N : +N] = (add_inputs ? y : 0) + round(w * B_s[l,e] . round_I(A_s[l,e] . x[row(i)]))
// with row(i) = m (w13 form, w = 1) or i (w2 form, mul_routed_weight, w = topk_weights[m, j]).
// Other pairs are untouched. Also add_lora_w13 / add_lora_w2 (SPEC §4.5-4.6) as host launchers.
#pragma once
#include <cstddef>
#include <cstdint>
#include <optional>
#include <cuda_runtime_api.h>
#include "kernels/common/dtype.h"
#include "kernels/common/lora_types.h"
#include "kernels/moe_lora_align/moe_lora_align.h"

namespace punica::kernels {

constexpr int kMoeLoraMaxRank = 512;       // max_rank and a_rank limit of the kernels
constexpr int kMoeLoraMaxBlockSize = 256;  // block_size limit of the aligned path

// Which pairs a call visits, and with which expert: the output of moe_lora_align (what add_lora_w13
// returns and add_lora_w2 reuses).
struct MoeLoraRouting {
  bool naive = false;                          // every pair its own block: expert_ids is [M*k]
  int block_size = 16;                         // aligned path: BLOCK_SIZE_M of the alignment
  int64_t max_padded = 0;                      // aligned: P (expert_ids is [L, ceil(P / block_size)])
  const int32_t* sorted_token_ids = nullptr;   // aligned: [L, P], entries >= M*k are padding
  const int32_t* expert_ids = nullptr;         // aligned: [L, Q] local expert per block, -1 = none; naive: [M*k]
  const int32_t* num_tokens_post_pad = nullptr;// aligned: [L]
  const int32_t* lora_ids = nullptr;           // aligned: [L+1] slots whose lists are valid (as given to the
                                               // alignment); null = every slot 0..L-1
};

struct FusedMoeLoraArgs {
  DType dtype = DType::bf16;              // x, lora_a, lora_b, y (fp16 or bf16)
  // The rank-r intermediate: rounded to it (one call) or the split buffer's dtype. Unset = dtype (the
  // output dtype, as vLLM); fp32 keeps it unrounded (the dense ops' buffer).
  std::optional<DType> intermediate_dtype;
  DType inter_dtype() const { return intermediate_dtype.value_or(dtype); }
  int64_t num_tokens = 0;                 // M
  int top_k = 1;                          // k
  int64_t hidden = 0;                     // K: A's input width (H for w13, I for w2)
  const void* x = nullptr;                // w13: [M, K]; w2 (mul_routed_weight): [M*k, K]; row stride below
  int64_t x_row_stride = 0;
  bool mul_routed_weight = false;         // w2 form: x row = pair, delta times topk_weights[m, j]
  const float* topk_weights = nullptr;    // [M, k] fp32 (read only when mul_routed_weight)
  int num_slices = 1;                     // S: 2 gated w13 (gate | up), 1 non-gated w13 / w2
  const void* lora_a[kMaxSlices] = {};    // each [L, E (1 if shared_a), a_rank, K]
  const void* lora_b[kMaxSlices] = {};    // each [L, E (1 if shared_b), N, max_rank]
  bool shared_a = false;                  // shared (expert-broadcast) LoRA: expert stride 0
  bool shared_b = false;
  int num_experts = 0;                    // E: local experts; expert ids outside [0, E) add nothing
  int64_t slice_width = 0;                // N (every slice)
  int max_loras = 0;                      // L
  int max_rank = 0;                       // r: B's rank dim and the expand's intermediate width
  int a_rank = 0;                         // A's rank dim (0 = max_rank; r/tp for sharded w13)
  int a_rank_offset = 0;                  // first global rank row held by A (sharded w13: tp_rank * a_rank)
  const int32_t* lora_ranks = nullptr;    // [L] true rank per slot (<= max_rank; null = max_rank)
  const int32_t* token_lora_mapping = nullptr;  // [M] slot per token, -1 = none
  const int32_t* adapter_enabled = nullptr;     // [L+1] (null = all enabled)
  MoeLoraRouting routing;
  void* y = nullptr;                      // [M, k, >= offset + S*N] pairs' rows, row stride y_row_stride
  int64_t y_row_stride = 0;
  int64_t offset = 0;                     // first column written (sharded w2: tp_rank * H/tp)
  bool add_inputs = true;
  void* intermediate = nullptr;           // split form: [S, M, k, a_rank] (shrink) / [S, M, k, max_rank]
                                          // (expand), intermediate_dtype. One call: optional scratch of
                                          // fused_moe_lora_workspace_bytes (clobbered; spreads the work;
                                          // 16-byte aligned for the tensor-core kernels)
};

// One call: shrink and expand fused, the intermediate kept on chip.
// Asynchronous on `stream`, no host synchronisation or allocation (graph capturable); M = 0 is a no-op.
// lora_ids entries must be distinct (each slot's pairs are visited once per entry).
// With `intermediate` set it runs as shrink + column-tiled expand through it (same y bits).
void launch_add_lora_fused_moe(const FusedMoeLoraArgs& args, cudaStream_t stream);
// Bytes of the one call's optional scratch: S * M * k * max_rank of intermediate_dtype (the
// intermediate), then, where max_rank <= 64 and M * k < 8192, the split-K shrink's tickets and fp32
// part sums (S * M * k * (8 + 4 * max_rank * parts) bytes, parts = min(16, 8192 / (M * k)), regions
// 256-byte aligned): at most S * (8 M k + 32768 max_rank) bytes more.
std::size_t fused_moe_lora_workspace_bytes(int64_t num_tokens, int top_k, int num_slices, int max_rank,
                                           DType inter_dtype);
// The fully-sharded split, so a collective can run between the halves. Shrink OVERWRITES the whole
// intermediate [S, M, k, a_rank]: rows of visited pairs hold round_I(A . x) over the local true rank
// (clamp(lora_ranks[l] - a_rank_offset, 0, a_rank)), every other element 0. Expand reads
// [S, M, k, max_rank] (after an all-gather along the rank dim, or an all-reduce) and writes y as the
// one-call form does (visited pairs only).
void launch_fused_moe_lora_shrink(const FusedMoeLoraArgs& args, cudaStream_t stream);
void launch_fused_moe_lora_expand(const FusedMoeLoraArgs& args, cudaStream_t stream);

// ---- add_lora_w13 / add_lora_w2 (alignment + fused op) ----
struct AddLoraW13Args {
  FusedMoeLoraArgs op;                    // the w13 form (mul_routed_weight ignored: false); op.routing is
                                          // filled by the launcher
  const int32_t* topk_ids = nullptr;      // [M, k]
  const int32_t* expert_map = nullptr;    // [num_experts_global] global -> local, -1 = elsewhere; null = none
  int num_experts_global = 0;             // expert_map's length (0 = op.num_experts)
  int block_size = 16;                    // the aligned path's block size (16/32/64/...)
  bool pad_sorted_ids = false;
  const int32_t* lora_ids = nullptr;      // [L+1] active slots (null = every slot)
  // Routing buffers the caller allocates: sorted [L*P], expert_ids [max(L*Q, M*k)], ntpp [L]
  // (moe_lora_w13_routing_elems), plus the alignment's workspace.
  int32_t* sorted_token_ids = nullptr;
  int32_t* expert_ids = nullptr;
  int32_t* num_tokens_post_pad = nullptr;
  void* workspace = nullptr;
  std::size_t workspace_bytes = 0;
};
struct MoeLoraRoutingElems {
  int64_t sorted = 0, expert_ids = 0, num_tokens_post_pad = 0;
};
MoeLoraRoutingElems moe_lora_w13_routing_elems(int64_t max_tokens, int top_k, int num_experts_k, int block_size,
                                               int max_loras, bool pad_sorted_ids);
// add_lora_w13's plumbing, shared by the launcher and the references. The path (vLLM's sparsity
// rule) and the routing handed to the fused op: naive = topk_ids as the per-pair expert ids (ids
// >= E add nothing); aligned = the alignment's buffers.
inline MoeLoraRouting moe_lora_w13_routing(const AddLoraW13Args& a) {
  const FusedMoeLoraArgs& op = a.op;
  const int Ek = a.expert_map && a.num_experts_global > 0 ? a.num_experts_global : op.num_experts;
  MoeLoraRouting r;
  r.naive = moe_lora_use_naive(op.num_tokens, op.top_k, op.num_experts, op.max_loras, a.expert_map != nullptr);
  r.lora_ids = a.lora_ids;
  r.block_size = a.block_size;
  if (r.naive) {
    r.expert_ids = a.topk_ids;
    return r;
  }
  r.max_padded = moe_lora_align_sizes(op.num_tokens * op.top_k, Ek, a.block_size, a.pad_sorted_ids).max_padded;
  r.sorted_token_ids = a.sorted_token_ids;
  r.expert_ids = a.expert_ids;
  r.num_tokens_post_pad = a.num_tokens_post_pad;
  return r;
}
// The alignment of the aligned path: E_k = expert_map's length (else E), vLLM's P.
inline MoeLoraAlignArgs moe_lora_w13_align_args(const AddLoraW13Args& a) {
  MoeLoraAlignArgs al;
  al.num_tokens = a.op.num_tokens;
  al.top_k = a.op.top_k;
  al.topk_ids = a.topk_ids;
  al.token_lora_mapping = a.op.token_lora_mapping;
  al.num_experts = a.expert_map && a.num_experts_global > 0 ? a.num_experts_global : a.op.num_experts;
  al.expert_map = a.expert_map;
  al.block_size = a.block_size;
  al.max_loras = a.op.max_loras;
  al.adapter_enabled = a.op.adapter_enabled;
  al.lora_ids = a.lora_ids;
  al.pad_sorted_ids = a.pad_sorted_ids;
  al.max_padded = moe_lora_w13_routing(a).max_padded;
  al.sorted_token_ids = a.sorted_token_ids;
  al.expert_ids = a.expert_ids;
  al.num_tokens_post_pad = a.num_tokens_post_pad;
  al.workspace = a.workspace;
  al.workspace_bytes = a.workspace_bytes;
  return al;
}

// Runs the alignment (aligned path) or none (naive path, moe_lora_use_naive) then the fused op.
// Returns the routing for add_lora_w2; .naive records which path ran.
MoeLoraRouting launch_add_lora_w13(const AddLoraW13Args& args, cudaStream_t stream);
// args.routing = what add_lora_w13 returned; the w2 form (mul_routed_weight forced on).
void launch_add_lora_w2(const FusedMoeLoraArgs& args, cudaStream_t stream);

}  // namespace punica::kernels
