// vLLM moe_lora_align_block_size (SPEC §4.2, A.5): for every processed adapter slot l, the (token,
// expert) pairs i = m*k + j of tokens mapped to l, grouped by (local) expert, each group padded
// to block_size with the sentinel numel = M*k; expert_ids per block (-1 past the end);
// num_tokens_post_pad[l]. Slots not processed (id -1, disabled, >= L) are left untouched.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cuda_runtime_api.h>

namespace punica::kernels {

// vLLM's buffer sizes: P = numel + E_k*(bs-1) (rounded up to bs with pad_sorted_ids;
// numel*bs when numel < E_k), Q = ceil(P / bs). sorted_token_ids is [L, P], expert_ids [L, Q].
struct MoeLoraAlignSizes {
  int64_t max_padded = 0;  // P
  int64_t max_blocks = 0;  // Q
};
inline MoeLoraAlignSizes moe_lora_align_sizes(int64_t numel, int num_experts, int block_size,
                                              bool pad_sorted_ids) {
  MoeLoraAlignSizes s;
  if (block_size <= 0) return s;
  int64_t P = numel + int64_t(num_experts) * (block_size - 1);
  if (pad_sorted_ids) P = (P + block_size - 1) / block_size * block_size;
  if (numel < num_experts) P = numel * block_size;
  s.max_padded = P;
  s.max_blocks = (P + block_size - 1) / block_size;
  return s;
}

// vLLM add_lora_w13's sparsity rule ("SPARSITY_FACTOR = 8"): the naive block assignment (every
// pair its own block, no alignment kernel) when there is no expert_map and
// num_tokens * top_k * 8 <= local_experts * max_loras.
inline bool moe_lora_use_naive(int64_t num_tokens, int top_k, int local_experts, int max_loras,
                               bool has_expert_map) {
  return !has_expert_map && num_tokens * top_k * 8 <= int64_t(local_experts) * max_loras;
}

constexpr int kMoeAlignMaxExperts = 992;  // vLLM's limit round_up(E_k, 32) < 1024

struct MoeLoraAlignArgs {
  int64_t num_tokens = 0;                      // M (may be 0)
  int top_k = 1;                               // k; numel = M * k
  const int32_t* topk_ids = nullptr;           // [M, k] global expert ids (ids >= num_experts dropped)
  const int32_t* token_lora_mapping = nullptr; // [M] slot per token, -1 = none
  int num_experts = 0;                         // E_k: expert_map's length if given, else local E
  const int32_t* expert_map = nullptr;         // [E_k] global -> local id, -1 = not on this rank; null = identity
  int block_size = 16;                         // = the fused op's BLOCK_SIZE_M
  int max_loras = 0;                           // L
  const int32_t* adapter_enabled = nullptr;    // [L+1] (null = all enabled)
  // Slots to process: [L+1] distinct ids, -1 / >= L / disabled skipped (LoRAKernelMeta's
  // active_lora_ids). Null = every slot 0..L-1 (each enabled slot then gets its lists, empty or not).
  const int32_t* lora_ids = nullptr;
  bool naive = false;                          // naive block assignment: expert_ids[i] = local id of pair i
                                               // (-1 when dropped), nothing else written
  int64_t max_padded = 0;                      // P (0 = moe_lora_align_sizes(M*k, E_k, bs, pad_sorted_ids))
  bool pad_sorted_ids = false;
  // outputs
  int32_t* sorted_token_ids = nullptr;         // [L, P] (unused when naive)
  int32_t* expert_ids = nullptr;               // [L, Q] (naive: [M*k])
  int32_t* num_tokens_post_pad = nullptr;      // [L] (unused when naive)
  void* workspace = nullptr;                   // moe_lora_align_workspace_bytes(...) bytes
  std::size_t workspace_bytes = 0;
};

// Temporary storage of the device implementation. It is 0 today (one block per slot with
// shared-memory counters and a CUB block scan); callers still pass what this returns.
std::size_t moe_lora_align_workspace_bytes(int64_t max_tokens, int top_k, int num_experts, int max_loras);
// Asynchronous on `stream`; no host synchronisation or allocation (graph capturable).
void launch_moe_lora_align(const MoeLoraAlignArgs& args, cudaStream_t stream);

}  // namespace punica::kernels
