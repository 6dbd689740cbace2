// Eigen CPU reference of every dense LoRA op contract (kernels/<op>/<op>.h), on HOST pointers,
// with the GPU semantics: -1 tokens untouched, shrink overwrites, expand widths from B, scale once,
// fp32 accumulation. naive:: holds independent fp64 triple loops that check the Eigen path.
#pragma once
#include <cstdint>
#include <optional>
#include <vector>
#include "kernels/lora_meta/lora_meta.h"
#include "kernels/lora_shrink/lora_shrink.h"
#include "kernels/lora_expand/lora_expand.h"
#include "kernels/add_lora_linear/add_lora_linear.h"
#include "kernels/add_lora_embedding/add_lora_embedding.h"
#include "kernels/add_lora_logits/add_lora_logits.h"
#include "kernels/apply_lora_full_linear/apply_lora_full_linear.h"

namespace punica::ref {

struct RefOptions {
  // Round the rank-r intermediate to the weight dtype before the expand, as vLLM's Triton expand
  // (and our kernels) do. Off = keep it in fp32 (the "ideal" math).
  bool round_intermediate = true;
};

// ---- vLLM metadata (SPEC §2) ----
struct ConvertMappingResult {
  std::vector<int32_t> base_indices;            // token_lora_indices [T] (slot or -1)
  std::vector<int32_t> sampler_indices;         // [R]
  std::vector<int64_t> sampler_indices_padded;  // [R]
  std::vector<int64_t> embeddings_indices;      // [T] slot * vocab_size (0 for no LoRA)
  std::vector<int64_t> indices_len;             // {T, R, R, T}
};
// index_mapping / prompt_mapping hold adapter int ids (> 0, 0 = none); lora_index_to_id has one
// entry per slot (nullopt = empty). Throws punica::Error(usage) for an id not in any slot.
ConvertMappingResult convert_mapping(const std::vector<int64_t>& index_mapping,
                                     const std::vector<int64_t>& prompt_mapping,
                                     const std::vector<std::optional<int64_t>>& lora_index_to_id,
                                     int max_loras_arg, int64_t vocab_size);

struct ComputeMetaResult {  // run-length segments of consecutive equal slots (sgmv metadata)
  std::vector<int64_t> seq_start_locs, seq_lengths, lora_indices_per_batch;
  int64_t batch_size = 0, max_length = 0, token_nums = 0;
  bool no_lora = false;
};
ComputeMetaResult compute_meta(const std::vector<int32_t>& token_lora_indices);

// LoRAKernelMeta.prepare_tensors on host buffers (same Args as the CUDA launcher; workspace unused).
void lora_meta(const kernels::LoraMetaArgs& a);

// ---- dense ops (Eigen, fp32 accumulation) ----
void lora_shrink(const kernels::LoraShrinkArgs& a);
void lora_expand(const kernels::LoraExpandArgs& a);
// RefOptions applies to the ops whose intermediate stays inside the op.
void add_lora_linear(const kernels::AddLoraLinearArgs& a, const RefOptions& o = {});
void add_lora_embedding(const kernels::AddLoraEmbeddingArgs& a);
void add_lora_logits(const kernels::AddLoraLogitsArgs& a, const RefOptions& o = {});
void apply_lora_full_linear(const kernels::ApplyLoraFullLinearArgs& a);

// ---- independent naive fp64 loops (the check of the Eigen path) ----
namespace naive {
void lora_meta(const kernels::LoraMetaArgs& a);
void lora_shrink(const kernels::LoraShrinkArgs& a);
void lora_expand(const kernels::LoraExpandArgs& a);
void add_lora_linear(const kernels::AddLoraLinearArgs& a, const RefOptions& o = {});
void add_lora_embedding(const kernels::AddLoraEmbeddingArgs& a);
void add_lora_logits(const kernels::AddLoraLogitsArgs& a, const RefOptions& o = {});
void apply_lora_full_linear(const kernels::ApplyLoraFullLinearArgs& a);
}  // namespace naive

}  // namespace punica::ref
