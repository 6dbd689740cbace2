// The kit of the MoE LoRA registry entries (moe_lora_align, add_lora_fused_moe, add_lora_w13,
// add_lora_w2; SPEC §4.2-4.6): their scenario fields (declared once here, listed by each entry),
// the MoE sizes from the fields or the model preset, the routing (distinct top-k experts per token,
// uniform or zipf over experts, softmax weights, out-of-range ids), expert_map, adapter_enabled,
// the stacked per-expert weights, and the floor / cuBLAS baseline over the (adapter, expert) pairs
// the batch touches (README, "Floors and baselines").
#pragma once
#include <map>
#include <string>
#include <utility>
#include <vector>
#include "apps/punica-bench/ops/op_kit.h"
#include "kernels/fused_moe_lora/fused_moe_lora.h"
#include "kernels/fused_moe_lora/heuristics.h"
#include "kernels/moe_lora_align/moe_lora_align.h"
#include "reference/moe_reference.h"

namespace punica::bench {

// ---- scenario fields ----
// Canonical orders slot each field after the shared field it relates to (shared = 10 x index:
// hidden 50, slices 60, num_tokens 160, num_adapters 180, max_rank 210, popularity 220,
// offset_start 270).
inline std::vector<FieldSpec> moe_field_specs() {
  using nlohmann::json;
  std::vector<FieldSpec> f;
  auto add = [&](const char* name, int order, json schema, const char* desc) {
    FieldSpec s;
    s.name = name;
    s.order = order;
    s.value_schema = std::move(schema);
    s.description = desc;
    f.push_back(std::move(s));
  };
  add("form", 45, {{"type", "string"}, {"enum", {"w13", "w2"}}},
      "MoE LoRA form of add_lora_fused_moe: w13 (x row = token [T, hidden], unweighted, gate|up slices of "
      "moe_intermediate) or w2 (x row = pair [T*top_k, moe_intermediate], times the routing weight, one "
      "slice of hidden). Default w13.");
  add("moe_intermediate", 51, {{"type", "integer"}, {"minimum", 1}},
      "MoE expert intermediate width I (the model preset's moe_intermediate by default): w13 writes S x I "
      "columns per pair, w2 reads I. `hidden` is H.");
  add("num_experts", 52, {{"type", "integer"}, {"minimum", 1}, {"maximum", kernels::kMoeAlignMaxExperts}},
      "Routed experts E (global count; the model preset's by default). With expert_map half_local, "
      "ceil(E/2) of them are local.");
  add("top_k", 53, {{"type", "integer"}, {"minimum", 1}, {"maximum", 64}},
      "Experts per token k (distinct; the model preset's by default).");
  add("expert_map", 54, {{"type", "string"}, {"enum", {"none", "half_local"}}},
      "Expert parallelism: none (every expert local) or half_local (even global ids are local g/2, odd ones "
      "-1 = on another rank). Default none.");
  add("gated", 65, {{"type", "boolean"}},
      "w13 form: 2 slices (gate | up, default) or 1 (non-gated MoE, the up projection only).");
  add("disabled_adapters", 185, {{"type", "integer"}, {"minimum", 0}},
      "The slots of the first n loaded adapters get adapter_enabled = 0 (their pairs stay untouched). "
      "Default 0.");
  add("shared_lora", 215, {{"type", "boolean"}},
      "Shared (expert-broadcast) LoRA, expert stride 0: w13's A and w2's B have expert dim 1 (vLLM "
      "enable_moe_shared_loras). Default false.");
  add("routing", 225, {{"type", "string"}, {"enum", {"uniform", "zipf"}}},
      "Expert choice per token (seeded, distinct): uniform, or zipf (expert weight 1/rank over a seeded "
      "expert order: a few hot experts). Weights: softmax of seeded logits. Default uniform.");
  add("oob_expert_fraction", 226, {{"type", "number"}, {"minimum", 0}, {"maximum", 1}},
      "Share of routed entries replaced by an expert id >= the expert count (shared-expert fusion ids): "
      "they add nothing. Default 0.");
  add("block_size", 275, {{"type", "integer"}, {"minimum", 16}, {"maximum", kernels::kMoeLoraMaxBlockSize}},
      "The alignment's block size = the fused op's BLOCK_SIZE_M: 16 (default), 32, 64, 128 or 256.");
  add("naive", 276, {{"type", "string"}, {"enum", {"auto", "naive", "aligned"}}},
      "Block assignment of moe_lora_align / add_lora_fused_moe: naive (every pair its own block), aligned "
      "(per (adapter, expert) groups padded to block_size) or auto (default: vLLM add_lora_w13's sparsity "
      "rule, naive when no expert_map and T*k*8 <= local experts * max_loras). add_lora_w13 / add_lora_w2 "
      "always follow the rule; the result's plan records the path.");
  return f;
}
inline std::vector<FieldSpec> moe_fields(const std::vector<std::string>& names) {
  std::vector<FieldSpec> out;
  for (auto& f : moe_field_specs())
    if (std::find(names.begin(), names.end(), f.name) != names.end()) out.push_back(f);
  return out;
}

// ---- sizes (fields, else the model preset) ----
struct MoeConfig {
  int E = 0;        // global expert count (= expert_map length with a map)
  int E_local = 0;  // local experts
  int top_k = 0;
  int64_t H = 0, I = 0;
  int block_size = 16;
  std::string naive = "auto", expert_map = "none", routing = "uniform", form = "w13";
  double oob = 0;
  bool gated = true, shared = false;
  int disabled = 0;
  bool has_map() const { return expert_map != "none"; }
};
inline MoeConfig moe_config_from(const nlohmann::json& p, const std::string& model, int64_t hidden) {
  MoeConfig m;
  const ModelPreset* mp = model.empty() ? nullptr : find_model(model);
  auto i64 = [&](const char* k, int64_t d) { return p.contains(k) ? p[k].get<int64_t>() : d; };
  auto str = [&](const char* k, const char* d) { return p.contains(k) ? p[k].get<std::string>() : std::string(d); };
  m.E = int(i64("num_experts", mp ? mp->num_experts : 0));
  m.top_k = int(i64("top_k", mp ? mp->top_k : 0));
  m.I = i64("moe_intermediate", mp ? mp->moe_intermediate : 0);
  m.H = hidden;
  m.block_size = int(i64("block_size", 16));
  m.naive = str("naive", "auto");
  m.expert_map = str("expert_map", "none");
  m.routing = str("routing", "uniform");
  m.form = str("form", "w13");
  m.oob = p.contains("oob_expert_fraction") ? p["oob_expert_fraction"].get<double>() : 0.0;
  m.gated = p.contains("gated") ? p["gated"].get<bool>() : true;
  m.shared = p.contains("shared_lora") ? p["shared_lora"].get<bool>() : false;
  m.disabled = int(i64("disabled_adapters", 0));
  m.E_local = m.has_map() ? (m.E + 1) / 2 : m.E;
  return m;
}
inline MoeConfig moe_config(const Case& c) { return moe_config_from(c.params, c.model, c.hidden); }

// ---- scenario hooks shared by the MoE entries ----
// The case's op fields as written so far (CaseContext), for moe_config_from.
inline nlohmann::json moe_given(CaseContext& x) {
  nlohmann::json p = nlohmann::json::object();
  for (const auto& f : moe_field_specs())
    if (x.has(f.name)) p[f.name] = x.value(f.name);
  return p;
}
// What one form writes: S slices of N from K inputs.
struct MoeForm {
  bool w2 = false;
  int S = 1;
  int64_t K = 0, N = 0;
};
inline MoeForm moe_form(const MoeConfig& m, bool w2) {
  MoeForm f;
  f.w2 = w2;
  f.S = w2 ? 1 : (m.gated ? 2 : 1);
  f.K = w2 ? m.I : m.H;
  f.N = w2 ? m.H : m.I;
  return f;
}
// defaults: the intermediate buffer in the output dtype unless given (vLLM); the slices the form
// writes (recorded in the result) when `form_of` names one.
inline std::vector<int64_t> moe_defaults(CaseContext& x, int form_of /* -1 none, 0 w13, 1 w2, 2 field */) {
  if (!x.has("intermediate_dtype")) x.c().intermediate_dtype = x.c().dtype;
  if (form_of < 0) return {};
  const MoeConfig m = moe_config_from(moe_given(x), x.c().model, x.c().hidden);
  const bool w2 = form_of == 1 || (form_of == 2 && m.form == "w2");
  const MoeForm f = moe_form(m, w2);
  if (f.N <= 0) return {};
  return std::vector<int64_t>(std::size_t(f.S), f.N);
}
inline void moe_require(CaseContext& x, bool needs_sizes) {
  const MoeConfig m = moe_config_from(moe_given(x), x.c().model, x.c().hidden);
  if (m.E <= 0) x.missing("num_experts (or an MoE model)");
  if (m.top_k <= 0) x.missing("top_k (or an MoE model)");
  if (needs_sizes) {
    require_hidden(x);
    if (m.I <= 0) x.missing("moe_intermediate (or an MoE model)");
  }
  if (needs_sizes && x.c().dtype == DType::f32)
    x.problem("expected dtype fp16 or bf16 for the fused MoE LoRA ops, got fp32", {"dtype"});
  if (m.top_k > m.E)
    x.problem("expected top_k <= num_experts " + std::to_string(m.E) + " (distinct experts), got " +
                  std::to_string(m.top_k),
              {"top_k", "num_experts", "model"});
  const int bs = m.block_size;
  if (bs != 16 && bs != 32 && bs != 64 && bs != 128 && bs != 256)
    x.problem("expected block_size 16, 32, 64, 128 or 256, got " + std::to_string(bs), {"block_size"});
  if (m.has_map() && m.E < 2)
    x.problem("expected num_experts >= 2 with expert_map half_local", {"expert_map", "num_experts", "model"});
  if (m.disabled > x.c().num_adapters)
    x.problem("expected disabled_adapters <= num_adapters " + std::to_string(x.c().num_adapters),
              {"disabled_adapters", "num_adapters"});
  if (x.c().max_rank > kernels::kMoeLoraMaxRank)
    x.problem("expected max_rank <= " + std::to_string(kernels::kMoeLoraMaxRank) + " for the MoE ops",
              {"max_rank", "ranks"});
  if (x.has("slices") || x.has("num_slices"))
    x.problem("expected no slices for an MoE op (they follow from hidden, moe_intermediate, form and gated)",
              {"slices", "num_slices"});
}
// The MoE ops take no module (their shapes are the expert's): any module is a skip.
inline void moe_applicable(CaseContext& x) { skip_unless_module(x, {}); }

// ---- the problem's routing state ----
struct MoeCommon {
  MoeConfig cfg;
  int L = 0, r = 0;
  int64_t M = 0;
  std::vector<int32_t> slot_rank, mapping, topk, emap, enabled, lora_ids;
  std::vector<float> weights;
  int ranks_idx = -1, map_idx = -1, topk_idx = -1, w_idx = -1, emap_idx = -1, enabled_idx = -1, lora_ids_idx = -1;
  // routing buffers (scratch: prepare() / the reference fill them)
  int sorted_idx = -1, eids_idx = -1, ntpp_idx = -1, ws_idx = -1;
  std::size_t ws_bytes = 0;
  kernels::MoeLoraRoutingElems elems;

  int Ek() const { return cfg.E; }  // the alignment's expert count (expert_map's length with a map)
  int64_t numel() const { return M * cfg.top_k; }
  // Local expert of pair i, -1 when none (out of range or on another rank).
  int local_expert(int64_t i) const {
    const int g = topk[std::size_t(i)];
    if (g < 0 || g >= cfg.E) return -1;
    const int e = cfg.has_map() ? emap[std::size_t(g)] : g;
    return e >= 0 && e < cfg.E_local ? e : -1;
  }
  // The slot of pair i when it carries a LoRA term (enabled adapter, valid local expert), else -1.
  int pair_slot(int64_t i) const {
    const int l = mapping[std::size_t(i / cfg.top_k)];
    if (l < 0 || l >= L || !enabled[std::size_t(l)]) return -1;
    return local_expert(i) >= 0 ? l : -1;
  }

  void init(const Case& c, const BatchLayout& lay, Builder& b) {
    cfg = moe_config(c);
    L = c.max_loras;
    r = c.max_rank;
    M = int64_t(lay.token_slot.size());
    slot_rank = lay.slot_rank;
    mapping = lay.token_slot;
    const int k = cfg.top_k, E = cfg.E;
    const uint64_t key = b.key("routing");
    // Distinct experts per token: uniform, or zipf (weight 1/(rank+1) over a seeded expert order).
    std::vector<double> pop(static_cast<std::size_t>(E), 1.0);
    if (cfg.routing == "zipf") {
      std::vector<int> order(static_cast<std::size_t>(E));
      for (int e = 0; e < E; ++e) order[std::size_t(e)] = e;
      for (int e = E - 1; e > 0; --e) std::swap(order[std::size_t(e)], order[hash_below(key + 1, uint64_t(e), uint64_t(e + 1))]);
      for (int rk = 0; rk < E; ++rk) pop[std::size_t(order[std::size_t(rk)])] = 1.0 / double(rk + 1);
    }
    topk.assign(std::size_t(numel()), 0);
    weights.assign(std::size_t(numel()), 0.f);
    std::vector<char> taken(static_cast<std::size_t>(E));
    for (int64_t m = 0; m < M; ++m) {
      std::fill(taken.begin(), taken.end(), 0);
      double z = 0;
      double left = 0;
      for (double v : pop) left += v;
      for (int j = 0; j < k; ++j) {
        const uint64_t idx = uint64_t(m) * 64 + uint64_t(j);
        double u = double(hash_below(key + 2, idx, uint64_t(1) << 40)) / double(uint64_t(1) << 40) * left;
        int pick = -1;
        for (int e = 0; e < E; ++e) {
          if (taken[std::size_t(e)]) continue;
          pick = e;
          if (u < pop[std::size_t(e)]) break;
          u -= pop[std::size_t(e)];
        }
        taken[std::size_t(pick)] = 1;
        left -= pop[std::size_t(pick)];
        int id = pick;
        if (cfg.oob > 0 && double(hash_below(key + 3, idx, 1000000)) < cfg.oob * 1e6)
          id = E + int(hash_below(key + 4, idx, 3));
        topk[std::size_t(m * k + j)] = id;
        const double v = std::exp(2.0 * hash_uniform(key + 5, idx));
        weights[std::size_t(m * k + j)] = float(v);
        z += v;
      }
      for (int j = 0; j < k; ++j) weights[std::size_t(m * k + j)] = float(weights[std::size_t(m * k + j)] / z);
    }
    if (cfg.has_map()) {
      emap.resize(std::size_t(E));
      for (int g = 0; g < E; ++g) emap[std::size_t(g)] = g % 2 == 0 ? g / 2 : -1;
    }
    enabled.assign(std::size_t(L + 1), 1);
    for (int a = 0; a < cfg.disabled && a < int(lay.adapter_slot.size()); ++a)
      if (lay.adapter_slot[std::size_t(a)] >= 0) enabled[std::size_t(lay.adapter_slot[std::size_t(a)])] = 0;
    // vLLM's lora_ids: LoRAKernelMeta's active_lora_ids (the batch's slots, then -1).
    std::vector<char> used(std::size_t(L), 0);
    for (int32_t s : mapping) if (s >= 0) used[std::size_t(s)] = 1;
    for (int l = 0; l < L; ++l) if (used[std::size_t(l)]) lora_ids.push_back(l);
    lora_ids.resize(std::size_t(L + 1), -1);

    ranks_idx = b.ints("lora_ranks", slot_rank);
    map_idx = b.ints("token_lora_mapping", mapping);
    topk_idx = b.ints("topk_ids", topk);
    enabled_idx = b.ints("adapter_enabled", enabled);
    lora_ids_idx = b.ints("lora_ids", lora_ids);
    if (cfg.has_map()) emap_idx = b.ints("expert_map", emap);
    HostTensor wt;
    // At least one row: an empty batch still hands the ops valid pointers.
    wt.name = "topk_weights"; wt.dtype = DType::f32; wt.shape = {std::max<int64_t>(M, 1), k}; wt.role = Role::input;
    wt.data.assign(wt.bytes(), 0);
    if (!weights.empty()) std::memcpy(wt.data.data(), weights.data(), weights.size() * 4);
    w_idx = b.add(std::move(wt));
  }
  // Routing buffers as scratch (the fused ops: filled by prepare() on the backend, by the reference
  // on the host).
  void add_routing_scratch(Builder& b) {
    elems = kernels::moe_lora_w13_routing_elems(std::max<int64_t>(M, 1), cfg.top_k, Ek(), cfg.block_size, L, false);
    sorted_idx = b.scratch("sorted_token_ids", std::size_t(std::max<int64_t>(elems.sorted, 1)) * 4);
    eids_idx = b.scratch("expert_ids", std::size_t(std::max<int64_t>(elems.expert_ids, 1)) * 4);
    ntpp_idx = b.scratch("num_tokens_post_pad", std::size_t(std::max<int64_t>(elems.num_tokens_post_pad, 1)) * 4);
    ws_bytes = std::max<std::size_t>(16, kernels::moe_lora_align_workspace_bytes(std::max<int64_t>(M, 1), cfg.top_k, Ek(), L));
    ws_idx = b.scratch("align_workspace", ws_bytes);
  }
  const int32_t* ptr(const std::vector<void*>& p, int i) const { return i < 0 ? nullptr : static_cast<const int32_t*>(p[std::size_t(i)]); }
  int32_t* mptr(const std::vector<void*>& p, int i) const { return i < 0 ? nullptr : static_cast<int32_t*>(p[std::size_t(i)]); }

  int64_t max_padded() const { return kernels::moe_lora_align_sizes(numel(), Ek(), cfg.block_size, false).max_padded; }
  // vLLM add_lora_w13's sparsity rule.
  bool rule_naive() const { return kernels::moe_lora_use_naive(M, cfg.top_k, cfg.E_local, L, cfg.has_map()); }
  bool path_naive() const { return cfg.naive == "naive" || (cfg.naive == "auto" && rule_naive()); }

  kernels::MoeLoraAlignArgs align_args(const std::vector<void*>& p, bool naive) const {
    kernels::MoeLoraAlignArgs a;
    a.num_tokens = M;
    a.top_k = cfg.top_k;
    a.topk_ids = ptr(p, topk_idx);
    a.token_lora_mapping = ptr(p, map_idx);
    a.num_experts = Ek();
    a.expert_map = ptr(p, emap_idx);
    a.block_size = cfg.block_size;
    a.max_loras = L;
    a.adapter_enabled = ptr(p, enabled_idx);
    a.lora_ids = ptr(p, lora_ids_idx);
    a.naive = naive;
    a.max_padded = max_padded();
    a.sorted_token_ids = mptr(p, sorted_idx);
    a.expert_ids = mptr(p, eids_idx);
    a.num_tokens_post_pad = mptr(p, ntpp_idx);
    a.workspace = ws_idx < 0 ? nullptr : p[std::size_t(ws_idx)];
    a.workspace_bytes = ws_idx < 0 ? 0 : ws_bytes;
    return a;
  }
  // The routing the fused op reads after align_args(p, naive) ran.
  kernels::MoeLoraRouting routing(const std::vector<void*>& p, bool naive) const {
    kernels::MoeLoraRouting r;
    r.naive = naive;
    r.block_size = cfg.block_size;
    r.lora_ids = ptr(p, lora_ids_idx);
    r.expert_ids = ptr(p, eids_idx);
    if (!naive) {
      r.max_padded = max_padded();
      r.sorted_token_ids = ptr(p, sorted_idx);
      r.num_tokens_post_pad = ptr(p, ntpp_idx);
    }
    return r;
  }

  // Pairs per touched (slot, local expert): the work the floor and the baseline count.
  std::map<std::pair<int, int>, int64_t> touched() const {
    std::map<std::pair<int, int>, int64_t> g;
    for (int64_t i = 0; i < numel(); ++i) {
      const int l = pair_slot(i);
      if (l >= 0) ++g[{l, local_expert(i)}];
    }
    return g;
  }
};

// Stacked per-expert weights [L, Eg, d1, d2] (Eg = E_local, or 1 shared): rank rows (A: d1 = r) or
// rank columns (B: d2 = r) beyond the slot's true rank are 0 (or NaN with --nan-padding); blocks of
// (slot, expert) pairs the batch does not touch are 0 (no hash: the big presets stay cheap to build).
inline int moe_stacked(Builder& b, const ProblemOptions& o, const std::string& name, DType dt, const MoeCommon& k,
                       int Eg, int64_t d1, int64_t d2, bool rank_rows, float scale) {
  HostTensor t;
  t.name = name; t.dtype = dt; t.shape = {k.L, Eg, d1, d2}; t.role = Role::input;
  t.data.assign(t.bytes(), 0);
  const auto used = k.touched();
  std::vector<char> slot_used(std::size_t(k.L), 0);
  for (const auto& [le, n] : used) slot_used[std::size_t(le.first)] = 1;
  const uint64_t key = b.key(name);
  for (int l = 0; l < k.L; ++l)
    for (int e = 0; e < Eg; ++e) {
      const bool live = Eg == 1 ? slot_used[std::size_t(l)] != 0 : used.count({l, e}) != 0;
      for (int64_t i = 0; i < d1; ++i)
        for (int64_t j = 0; j < d2; ++j) {
          const std::size_t idx = ((std::size_t(l) * Eg + std::size_t(e)) * std::size_t(d1) + std::size_t(i)) * std::size_t(d2) + std::size_t(j);
          const int64_t rank_index = rank_rows ? i : j;
          float v;
          if (rank_index >= k.slot_rank[std::size_t(l)]) v = o.nan_padding ? std::nanf("") : 0.0f;
          else if (!live) continue;
          else v = b.value(key, idx, scale);
          kernels::store_elem(t.data.data(), dt, idx, v);
        }
    }
  return b.add(std::move(t));
}

// The floor of a fused form (issue 44): weights at each adapter's true rank over the touched
// (adapter, expert) pairs (a shared side once per adapter), x rows of the pairs with a LoRA term
// (w13: their distinct tokens), y rows of those pairs (read too with add_inputs).
inline Work moe_fused_work(const MoeCommon& k, const MoeForm& f, DType dt, bool add_inputs, bool shared_a,
                           bool shared_b) {
  Work w;
  w.tokens = k.M;
  const double es = kernels::dtype_size(dt);
  const auto g = k.touched();
  std::map<int, char> slots;
  double pairs = 0, rank_pairs = 0;
  for (const auto& [le, n] : g) {
    const double rk = k.slot_rank[std::size_t(le.first)];
    slots[le.first] = 1;
    pairs += double(n);
    rank_pairs += double(n) * rk;
    if (!shared_a) w.bytes += rk * f.S * double(f.K) * es;
    if (!shared_b) w.bytes += rk * f.S * double(f.N) * es;
  }
  for (const auto& [l, one] : slots) {
    const double rk = k.slot_rank[std::size_t(l)];
    if (shared_a) w.bytes += rk * f.S * double(f.K) * es;
    if (shared_b) w.bytes += rk * f.S * double(f.N) * es;
  }
  double xrows = pairs;
  if (!f.w2) {
    xrows = 0;
    for (int64_t m = 0; m < k.M; ++m)
      for (int j = 0; j < k.cfg.top_k; ++j)
        if (k.pair_slot(m * k.cfg.top_k + j) >= 0) { xrows += 1; break; }
  }
  w.bytes += xrows * double(f.K) * es + (add_inputs ? 2 : 1) * pairs * f.S * double(f.N) * es;
  w.flops = 2.0 * rank_pairs * f.S * double(f.K + f.N);
  return w;
}
// cuBLAS grouped GEMMs of the same work: the shrink per touched (adapter, expert) (m = its pairs,
// n = S x rank, k = K, written), the expand per touched (adapter, expert) and slice (m = pairs,
// n = N, k = rank, accumulating as add_inputs).
inline Baseline moe_fused_baseline(const MoeCommon& k, const MoeForm& f, bool add_inputs) {
  Baseline bl;
  Baseline::Grouped shrink, expand;
  shrink.accumulate = false;
  expand.accumulate = add_inputs;
  for (const auto& [le, n] : k.touched()) {
    const int64_t rk = k.slot_rank[std::size_t(le.first)];
    if (rk <= 0) continue;
    shrink.groups.push_back({n, int64_t(f.S) * rk, f.K});
    for (int s = 0; s < f.S; ++s) expand.groups.push_back({n, f.N, rk});
  }
  if (!shrink.groups.empty()) {
    bl.grouped.push_back(std::move(shrink));
    bl.grouped.push_back(std::move(expand));
  }
  return bl;
}

// Marks of y [M, k, W]: pairs without a LoRA term and columns outside [c0, c1) must stay untouched.
inline void mark_moe_untouched(HostTensor& y, const MoeCommon& k, int64_t W, int64_t c0, int64_t c1) {
  for (int64_t i = 0; i < k.numel(); ++i) {
    const bool live = k.pair_slot(i) >= 0;
    for (int64_t c = 0; c < W; ++c)
      if (!live || c < c0 || c >= c1) y.must_keep[std::size_t(i * W + c)] = 1;
  }
}

// The tensors of one fused call (add_lora_fused_moe, add_lora_w13, add_lora_w2): routing state, x
// ([T, H] w13 / [T*k, I] w2, at least one row), the stacked A/B per slice, y [T, k, offset + S*N +
// guard columns] with its untouched marks, and the routing scratch.
struct MoeFused {
  MoeCommon k;
  MoeForm f;
  DType dtype = DType::bf16, inter = DType::bf16;
  bool add_inputs = true, shared_a = false, shared_b = false;
  int64_t offset = 0, W = 0;
  int x = -1, y = -1, a[kernels::kMaxSlices] = {}, b[kernels::kMaxSlices] = {};
  int inter_idx = -1;  // the one call's scratch (shrink + tiled expand through it)

  void build(const Case& c, const BatchLayout& lay, const ProblemOptions& o, std::vector<HostTensor>& out, bool w2,
             int64_t off) {
    Builder bld(c, o, out);
    dtype = c.dtype;
    inter = c.intermediate_dtype;
    add_inputs = c.add_inputs;
    offset = off;
    k.init(c, lay, bld);
    f = moe_form(k.cfg, w2);
    shared_a = k.cfg.shared && !w2;  // vLLM enable_moe_shared_loras: w13's A, w2's B
    shared_b = k.cfg.shared && w2;
    x = bld.random("x", dtype, {std::max<int64_t>(w2 ? k.numel() : k.M, 1), f.K}, 1.0f);
    const float as = 1.0f / std::sqrt(float(std::max<int64_t>(f.K, 1))), bs = 1.0f / std::sqrt(float(std::max(1, k.r)));
    for (int s = 0; s < f.S; ++s) {
      a[s] = moe_stacked(bld, o, "lora_a." + std::to_string(s), dtype, k, shared_a ? 1 : k.cfg.E_local, k.r, f.K, true, as);
      b[s] = moe_stacked(bld, o, "lora_b." + std::to_string(s), dtype, k, shared_b ? 1 : k.cfg.E_local, f.N, k.r, false, bs);
    }
    const int64_t c1 = offset + int64_t(f.S) * f.N;
    W = c1 + kGuardCols;
    y = bld.output("y", dtype, {k.M, k.cfg.top_k, W}, add_inputs, k.M, int64_t(k.cfg.top_k) * W);
    mark_moe_untouched(out[std::size_t(y)], k, W, offset, c1);
    k.add_routing_scratch(bld);
    inter_idx = bld.scratch("moe_intermediate", std::max<std::size_t>(16, kernels::fused_moe_lora_workspace_bytes(
                                                    std::max<int64_t>(k.M, 1), k.cfg.top_k, f.S, k.r, inter)));
  }
  // The fused op's Args without the routing.
  kernels::FusedMoeLoraArgs args(const std::vector<void*>& p) const {
    kernels::FusedMoeLoraArgs r;
    r.dtype = dtype;
    if (inter != dtype) r.intermediate_dtype = inter;
    r.num_tokens = k.M; r.top_k = k.cfg.top_k; r.hidden = f.K; r.x = p[std::size_t(x)]; r.x_row_stride = f.K;
    r.mul_routed_weight = f.w2;
    r.topk_weights = static_cast<const float*>(p[std::size_t(k.w_idx)]);
    r.num_slices = f.S;
    for (int s = 0; s < f.S; ++s) { r.lora_a[s] = p[std::size_t(a[s])]; r.lora_b[s] = p[std::size_t(b[s])]; }
    r.shared_a = shared_a; r.shared_b = shared_b;
    r.num_experts = k.cfg.E_local; r.slice_width = f.N; r.max_loras = k.L; r.max_rank = k.r;
    r.lora_ranks = k.ptr(p, k.ranks_idx);
    r.token_lora_mapping = k.ptr(p, k.map_idx);
    r.adapter_enabled = k.ptr(p, k.enabled_idx);
    r.y = p[std::size_t(y)]; r.y_row_stride = W; r.offset = offset; r.add_inputs = add_inputs;
    r.intermediate = p[std::size_t(inter_idx)];
    return r;
  }
  std::string describe(bool naive) const {
    return std::string(f.w2 ? "w2" : "w13") + " S=" + std::to_string(f.S) + " K=" + std::to_string(f.K) + " N=" +
           std::to_string(f.N) + " E=" + std::to_string(k.cfg.E) + " local=" + std::to_string(k.cfg.E_local) +
           " top_k=" + std::to_string(k.cfg.top_k) + " path=" + (naive ? "naive" : "aligned") + " block_size=" +
           std::to_string(k.cfg.block_size) + " pairs(adapter,expert)=" + std::to_string(k.touched().size());
  }
  Work work() const { return moe_fused_work(k, f, dtype, add_inputs, shared_a, shared_b); }
  Baseline baseline() const { return moe_fused_baseline(k, f, add_inputs); }
};

// A fused call over a routing built untimed in prepare() (add_lora_fused_moe, add_lora_w2): the
// aligned path runs the alignment; the naive path runs the alignment's naive mode (expert_ids = each
// pair's local expert) when `naive_align_`, else hands topk_ids as they are (vLLM's add_lora_w2 after
// a naive add_lora_w13: no expert_map there). The reference builds the same routing on the host
// (the fp64 loops' alignment with naive = true) before the fused op.
class MoeFusedProblem : public Problem {
 public:
  kernels::FusedMoeLoraArgs args(const std::vector<void*>& p) const {
    kernels::FusedMoeLoraArgs a = m_.args(p);
    a.routing = m_.k.routing(p, naive_);
    if (naive_ && !naive_align_) a.routing.expert_ids = m_.k.ptr(p, m_.k.topk_idx);
    return a;
  }
  void prepare(Backend& be, const std::vector<void*>& p) override {
    if (aligns()) run_op(be, m_.k.align_args(p, naive_));
  }
  void reference(const std::vector<void*>& p, bool naive) override {
    if (aligns()) {
      if (naive) ref::naive::moe_lora_align(m_.k.align_args(p, naive_));
      else ref::moe_lora_align(m_.k.align_args(p, naive_));
    }
    if (naive) ref::naive::add_lora_fused_moe(args(p)); else ref::add_lora_fused_moe(args(p));
  }
  Work work() const override { return m_.work(); }
  Baseline baseline() const override { return m_.baseline(); }

 protected:
  bool aligns() const { return !naive_ || naive_align_; }
  MoeFused m_;
  bool naive_ = false, naive_align_ = true;
};

// The OpSpec of an MoE entry: its fields (declared above), the shared hooks. form_of: -1 no slices
// (the alignment), 0 w13, 1 w2, 2 the case's `form`.
template <class P>
OpSpec moe_spec(const char* name, int order, const char* summary, const std::vector<std::string>& fields, int form_of) {
  OpSpec s;
  s.name = name;
  s.order = order;
  s.summary = summary;
  s.exclusive_fields = fields;
  s.fields = moe_fields(fields);
  s.defaults = [form_of](CaseContext& x) { return moe_defaults(x, form_of); };
  s.require = [form_of](CaseContext& x) { moe_require(x, form_of >= 0); };
  s.applicable = [](CaseContext& x) { moe_applicable(x); };
  s.make = [](const Case& c, const BatchLayout& l, const ProblemOptions& o) { return std::make_unique<P>(c, l, o); };
  return s;
}

}  // namespace punica::bench
