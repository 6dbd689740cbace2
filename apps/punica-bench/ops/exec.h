// The ops as the layers call them: each runs its CUDA kernel on the CUDA backend and its Eigen
// reference on the CPU backend (Backend::exec), asynchronously on the backend's stream. Each is
// defined in its registry entry (apps/punica-bench/ops/<op>.cpp).
#pragma once
#include "apps/punica-bench/backend/backend.h"
#include "kernels/add_lora_embedding/add_lora_embedding.h"
#include "kernels/bgmv_moe_lora_delta/bgmv_moe_lora_delta.h"
#include "kernels/add_lora_linear/add_lora_linear.h"
#include "kernels/add_lora_logits/add_lora_logits.h"
#include "kernels/fused_moe_lora/fused_moe_lora.h"
#include "kernels/lora_expand/lora_expand.h"
#include "kernels/lora_meta/lora_meta.h"
#include "kernels/lora_shrink/lora_shrink.h"
#include "kernels/moe_lora_align/moe_lora_align.h"

namespace punica::bench {

void run_op(Backend& be, const kernels::LoraMetaArgs& a);
void run_op(Backend& be, const kernels::LoraShrinkArgs& a);
void run_op(Backend& be, const kernels::LoraExpandArgs& a);
void run_op(Backend& be, const kernels::AddLoraLinearArgs& a);
void run_op(Backend& be, const kernels::AddLoraEmbeddingArgs& a);
void run_op(Backend& be, const kernels::AddLoraLogitsArgs& a);
// The MoE LoRA ops (SPEC §4.2-4.6): the alignment, the fused op (add_lora_fused_moe), add_lora_w13
// (returns the routing add_lora_w2 reuses) and add_lora_w2.
void run_op(Backend& be, const kernels::MoeLoraAlignArgs& a);
void run_op(Backend& be, const kernels::FusedMoeLoraArgs& a);
kernels::MoeLoraRouting run_op(Backend& be, const kernels::AddLoraW13Args& a);
void run_add_lora_w2(Backend& be, const kernels::FusedMoeLoraArgs& a);
// The fully sharded split of the fused op (a collective runs between the halves; the MoE layer).
void run_fused_moe_lora_shrink(Backend& be, const kernels::FusedMoeLoraArgs& a);
void run_fused_moe_lora_expand(Backend& be, const kernels::FusedMoeLoraArgs& a);
// FlashInfer's MoE LoRA deltas (SPEC §4.8.4-4.8.5).
void run_op(Backend& be, const kernels::BgmvMoeGemm1Args& a);
void run_op(Backend& be, const kernels::BgmvMoeGemm2Args& a);

}  // namespace punica::bench
