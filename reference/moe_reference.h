// CPU reference of the MoE LoRA op contracts (kernels/moe_lora_align, kernels/fused_moe_lora) on HOST
// pointers, with the GPU semantics (SPEC §4.2-4.6): the alignment's groups (any order inside a
// group), the fused op's roundings (intermediate to intermediate_dtype, delta to the output dtype,
// then the add), pairs without an enabled adapter or a valid local expert untouched. naive:: holds
// independent fp64 loops that check the Eigen path; check_moe_lora_align is the order-free contract.
#pragma once
#include <cstdint>
#include <string>
#include "kernels/fused_moe_lora/fused_moe_lora.h"
#include "kernels/moe_lora_align/moe_lora_align.h"

namespace punica::ref {

// ---- Eigen path (the reference the GPU tests compare with) ----
void moe_lora_align(const kernels::MoeLoraAlignArgs& a);
void add_lora_fused_moe(const kernels::FusedMoeLoraArgs& a);
void fused_moe_lora_shrink(const kernels::FusedMoeLoraArgs& a);  // overwrites [S, M, k, a_rank]
void fused_moe_lora_expand(const kernels::FusedMoeLoraArgs& a);
// Same path choice as kernels::launch_add_lora_w13 (moe_lora_use_naive), same routing buffers.
kernels::MoeLoraRouting add_lora_w13(const kernels::AddLoraW13Args& a);
void add_lora_w2(const kernels::FusedMoeLoraArgs& a);

// The order-free contract of SPEC §4.2 for one alignment result (`got_*`), given the inputs in `a`
// (its output pointers are ignored) and the buffers' contents before the call (`before_*`, to pin
// the untouched slots): per processed slot, num_tokens_post_pad, each group's entries as a set,
// the sentinels, the per-block experts and -1 past the end; unprocessed slots bit-equal to before.
// The naive mode: expert_ids[i] = local expert or -1. Returns "" when it holds, else what broke.
std::string check_moe_lora_align(const kernels::MoeLoraAlignArgs& a, const int32_t* got_sorted,
                                 const int32_t* got_expert_ids, const int32_t* got_ntpp,
                                 const int32_t* before_sorted, const int32_t* before_expert_ids,
                                 const int32_t* before_ntpp);

namespace naive {
void moe_lora_align(const kernels::MoeLoraAlignArgs& a);
void add_lora_fused_moe(const kernels::FusedMoeLoraArgs& a);
void fused_moe_lora_shrink(const kernels::FusedMoeLoraArgs& a);
void fused_moe_lora_expand(const kernels::FusedMoeLoraArgs& a);
kernels::MoeLoraRouting add_lora_w13(const kernels::AddLoraW13Args& a);
void add_lora_w2(const kernels::FusedMoeLoraArgs& a);
}  // namespace naive

}  // namespace punica::ref
