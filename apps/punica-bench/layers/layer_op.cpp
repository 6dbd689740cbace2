// Registry entry of op "layer": vLLM's tensor-parallel LoRA layers (SPEC §5; layers.h), with the
// layer kinds, the modules each fits, their slice counts and the TP degrees each can be split over.
#include <map>
#include "apps/punica-bench/layers/layers.h"
#include "apps/punica-bench/ops/moe_kit.h"
#include "apps/punica-bench/ops/op_kit.h"

namespace punica::bench {
namespace {

const std::vector<std::string> kLayers = {"replicated", "column", "merged_column", "qkv",
                                          "merged_qkv", "row", "vocab_embedding", "logits",
                                          "fused_moe"};

bool is_qkv(const std::string& l) { return l == "qkv" || l == "merged_qkv"; }

std::vector<int64_t> layer_defaults(CaseContext& x) {
  Case& c = x.c();
  if (c.layer.empty()) {
    std::string all;
    for (const auto& l : kLayers) all += (all.empty() ? "" : "|") + l;
    x.missing("layer (one of " + all + ")");
  }
  if (c.layer == "fused_moe") return moe_defaults(x, 0);  // the w13 slices (gate, up), for the record
  if (c.layer == "vocab_embedding") return c.hidden > 0 ? std::vector<int64_t>{c.hidden} : std::vector<int64_t>{};
  if (c.layer == "logits") return c.vocab > 0 ? std::vector<int64_t>{c.vocab} : std::vector<int64_t>{};
  if (is_qkv(c.layer) && c.num_heads > 0 && c.num_kv_heads > 0 && c.head_dim > 0) {
    const int64_t q = int64_t(c.num_heads) * c.head_dim, kv = int64_t(c.num_kv_heads) * c.head_dim;
    return {q, kv, kv};
  }
  return {};
}

void layer_require(CaseContext& x) {
  const Case& c = x.c();
  if (c.layer == "fused_moe") return moe_require(x, true);
  if (c.layer == "vocab_embedding" || c.layer == "logits") {
    require_vocab(x);
    require_hidden(x);
  } else if (is_qkv(c.layer)) {
    require_hidden(x);
    const ModelPreset* m = c.model.empty() ? nullptr : find_model(c.model);
    if (m && m->head_dim == 0 && c.head_dim <= 0)  // MLA presets (deepseek-v2-lite) have no plain heads
      return x.skip("model " + m->name + " uses multi-head latent attention: layer " + c.layer + " does not apply");
    if (c.num_heads <= 0 || c.num_kv_heads <= 0 || c.head_dim <= 0)
      x.missing("num_heads, num_kv_heads and head_dim (or model)");
    const int64_t q = int64_t(c.num_heads) * c.head_dim, kv = int64_t(c.num_kv_heads) * c.head_dim;
    std::vector<int64_t> want = {q, kv, kv};
    if (c.slices != want)
      x.problem("expected slices " + x.id_value("slices", nlohmann::json(want)) +
                    " (q, k, v widths from the heads), got " + x.id_value("slices", nlohmann::json(c.slices)),
                {"slices", "num_heads", "num_kv_heads", "head_dim", "layer"});
  } else {
    require_hidden(x);
    require_slices(x);
  }
}

// SPEC §5: which TP degrees a layer can be split over.
void layer_tp_rules(CaseContext& x) {
  const Case& c = x.c();
  const std::string& l = c.layer;
  const int tp = c.tp;
  const std::string tps = std::to_string(tp);
  if (c.fully_sharded && (l == "replicated" || l == "vocab_embedding" || l == "logits"))
    return x.skip("layer " + l + " has no fully-sharded variant");
  if (tp == 1) return;
  auto width = [&](int64_t w, const char* what) {
    if (w % tp != 0) x.skip(std::string(what) + " " + std::to_string(w) + " not divisible by tp " + tps);
  };
  bool column_family = l == "column" || l == "merged_column" || is_qkv(l);
  if (l == "column" || l == "merged_column")
    for (int64_t w : c.slices) width(w, "output slice width");
  if (is_qkv(l)) {
    if (c.num_heads % tp != 0)
      x.skip("q heads " + std::to_string(c.num_heads) + " not divisible by tp " + tps);
    else if (tp <= c.num_kv_heads && c.num_kv_heads % tp != 0)
      x.skip("kv heads " + std::to_string(c.num_kv_heads) + " not divisible by tp " + tps);
    else if (tp > c.num_kv_heads && tp % c.num_kv_heads != 0)
      x.skip("tp " + tps + " not a multiple of kv heads " + std::to_string(c.num_kv_heads) +
             " (kv-head replication)");
  }
  if (l == "row") {
    width(c.hidden, "input width (hidden)");
    if (c.fully_sharded && !c.slices.empty()) width(c.slices[0], "fully sharded row: output width");
  }
  if (l == "vocab_embedding" || l == "logits") width(c.vocab, "vocab");
  if (column_family && c.fully_sharded && c.max_rank % tp != 0)
    x.skip("fully sharded: max_rank " + std::to_string(c.max_rank) + " not divisible by tp " + tps);
}

// FusedMoEWithLoRA (SPEC §4.7): which TP / EP splits and layouts a case can take.
void moe_layer_rules(CaseContext& x) {
  moe_applicable(x);
  const Case& c = x.c();
  if (!c.skip_reason.empty()) return;
  const MoeConfig m = moe_config_from(moe_given(x), c.model, c.hidden);
  auto flag = [&](const char* k) { return x.has(k) && x.value(k).get<bool>(); };
  const bool ep = flag("expert_parallel");
  const std::string lay = x.has("w13_layout") ? x.value("w13_layout").get<std::string>() : "gated";
  const int tp = std::max(1, c.tp);
  const std::string tps = std::to_string(tp);
  if (flag("token_subset") && !ep) return x.skip("token_subset applies with expert_parallel only");
  if (lay != "gated" && !m.gated) return x.skip("w13_layout " + lay + " applies to a gated MoE only");
  if (ep) {
    if (c.fully_sharded)
      return x.skip("with expert_parallel the experts are not tensor-sharded: fully_sharded has nothing to shard");
    if (m.E < tp) x.skip("expert_parallel: " + std::to_string(m.E) + " experts over tp " + tps + " ranks");
    return;
  }
  if (m.I % tp != 0) return x.skip("moe_intermediate " + std::to_string(m.I) + " not divisible by tp " + tps);
  if (c.fully_sharded) {
    if (c.max_rank % tp != 0) return x.skip("fully sharded: max_rank " + std::to_string(c.max_rank) + " not divisible by tp " + tps);
    if (c.hidden % tp != 0) return x.skip("fully sharded: hidden " + std::to_string(c.hidden) + " not divisible by tp " + tps);
    if ((c.max_rank / tp) % 2 != 0)  // the rank-dim all_gather moves 16-bit pairs as 32-bit words
      return x.skip("fully sharded MoE: max_rank/tp = " + std::to_string(c.max_rank / tp) + " is odd");
  }
}

void layer_applicable(CaseContext& x) {
  const Case& c = x.c();
  if (c.layer == "fused_moe") return moe_layer_rules(x);
  static const std::map<std::string, std::vector<std::string>> fits = {
      {"replicated", {"o", "down"}}, {"column", {"o", "down"}},          {"merged_column", {"gate_up"}},
      {"qkv", {"qkv"}},              {"merged_qkv", {"qkv"}},            {"row", {"o", "down"}},
      {"vocab_embedding", {"embedding"}}, {"logits", {"lm_head"}}};
  if (!c.module.empty()) {
    const auto& f = fits.at(c.layer);
    if (std::find(f.begin(), f.end(), c.module) == f.end())
      x.skip("module " + c.module + " does not fit op " + c.op + " (layer " + c.layer + ")");
  } else if (c.skip_reason.empty()) {
    const std::string& l = c.layer;
    size_t S = c.slices.size();
    if ((l == "replicated" || l == "column" || l == "row") && S != 1)
      x.problem("expected 1 slice for layer " + l + ", got " + std::to_string(S), {"slices", "num_slices", "layer"});
    if (l == "merged_column" && S < 2)
      x.problem("expected at least 2 slices for layer merged_column, got " + std::to_string(S),
                {"slices", "num_slices", "layer"});
  }
  if (x.c().skip_reason.empty()) layer_tp_rules(x);
}

OpSpec spec() {
  OpSpec s;
  s.name = "layer";
  s.order = 1000;
  s.summary = "vLLM's TP LoRA layers (SPEC §5), plain and fully sharded, over Backend's collectives";
  s.multi_rank = true;
  s.exclusive_fields = {"layer"};
  FieldSpec layer;
  layer.name = "layer";
  layer.order = 40;
  layer.value_schema = {{"type", "string"}, {"enum", kLayers}};
  layer.description =
      "TP LoRA layer class (SPEC §5); required with op=layer, an error with any other op. Fits: "
      "replicated/column/row <- o|down, merged_column <- gate_up, qkv/merged_qkv <- qkv (slices stay [q, kv, "
      "kv]; for qkv one LoRA covers their concatenation), vocab_embedding <- embedding, logits <- lm_head; fused_moe (FusedMoEWithLoRA, "
      "SPEC §4.7) takes the MoE fields and no module.";
  auto field = [](const char* name, int order, nlohmann::json schema, const char* desc) {
    FieldSpec f;
    f.name = name;
    f.order = order;
    f.value_schema = std::move(schema);
    f.description = desc;
    return f;
  };
  const FieldSpec ep = field(
      "expert_parallel", 41, {{"type", "boolean"}},
      "layer fused_moe: expert parallelism over the tp ranks (vLLM enable_expert_parallel): experts split by "
      "vLLM's linear placement through expert_map, not tensor-sharded; every rank sees every token and the "
      "partial outputs are all-reduced. Default false.");
  const FieldSpec sub = field(
      "token_subset", 42, {{"type", "boolean"}},
      "layer fused_moe with expert_parallel: each rank gets only the tokens routed to its experts, their "
      "token_lora_mapping passed explicitly (as after an all-to-all); the rows are scattered back to [T, H] "
      "before the all-reduce. Default false.");
  const FieldSpec w13l = field(
      "w13_layout", 43, {{"type", "string"}, {"enum", {"gated", "3d", "3d_interleaved"}}},
      "layer fused_moe, gated: gated (two LoRA slices gate | up, default), 3d (FusedMoE3DWithLoRA: one slice "
      "whose B has 2*I rows [gate; up]) or 3d_interleaved (GPT-OSS: gate and up interleaved by row, in the "
      "base w13 and the LoRA B).");
  const FieldSpec gemm = field(
      "moe_base_gemm", 44, {{"type", "string"}, {"enum", {"per_expert", "grouped"}}},
      "layer fused_moe: how the CUDA backend runs the base expert GEMMs of a step: per_expert (one "
      "cublasGemmEx per local expert, default) or grouped (one cublasGemmGroupedBatchedEx over them, its "
      "pointer table written by a kernel). The CPU backend runs both alike.");
  s.fields = {layer, ep, sub, w13l, gemm};
  for (const char* f : {"expert_parallel", "token_subset", "w13_layout", "moe_base_gemm", "moe_intermediate", "num_experts", "top_k",
                        "gated", "shared_lora", "routing", "oob_expert_fraction", "disabled_adapters", "block_size"})
    s.exclusive_fields.push_back(f);
  s.defaults = layer_defaults;
  s.require = layer_require;
  s.applicable = layer_applicable;
  s.make = [](const Case& c, const BatchLayout& l, const ProblemOptions& o) { return make_layer_problem(c, l, o); };
  return s;
}
const RegisterOp kRegistered{spec()};

}  // namespace
}  // namespace punica::bench
