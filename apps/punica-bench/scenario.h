// Scenario files (schema punica-bench.scenario/1, DESIGN §4): defaults + cases, list-valued fields
// crossed, stable case ids, model presets (SPEC §7.1), and the deterministic adapter/request layout
// every backend and rank derives from (seed, case id) alone.
#pragma once
#include <cstdint>
#include <string>
#include <vector>
#include <nlohmann/json.hpp>
#include "kernels/common/dtype.h"

namespace punica::bench {

struct Popularity {
  std::string kind = "uniform";  // uniform | zipf | sorted | round_robin
  double zipf_alpha = 1.0;
};

// One fully crossed case. Sizes are resolved (model preset + module, or explicit fields).
struct Case {
  std::string id;       // "<name>/<op>/key=value/..." over every declared axis, fixed order
  std::string name;     // the case entry's name
  std::string op;       // a registered op (registry.h; `punica-bench info` lists them)
  std::string file;     // scenario path it came from
  nlohmann::json params;     // every axis value of this case (for the result record)
  std::string skip_reason;   // non-empty: a crossing-invalid combination (skip, not an error)

  // shapes
  std::string model;    // preset name or ""
  std::string module;   // qkv | o | gate_up | down | embedding | lm_head | "" (explicit sizes)
  std::string layer;    // for op == layer: replicated | column | merged_column | qkv | merged_qkv |
                        // row | vocab_embedding | logits
  int64_t hidden = 0;                 // K (input width); embedding: embed dim
  std::vector<int64_t> slices;        // N_s output widths (full, unsharded)
  int64_t vocab = 0;                  // embedding / logits vocabulary
  int64_t out_features = 0;           // the out_features field (its op's entry sets the default)
  int num_heads = 0, num_kv_heads = 0, head_dim = 0;  // qkv layers (GQA)

  // batch
  std::string phase = "decode";       // prefill | decode
  int64_t num_requests = 0;
  int64_t tokens_per_request = 1;
  int64_t num_tokens = 0;             // = num_requests * tokens_per_request
  // adapters
  int max_loras = 0;                  // L slots
  int num_adapters = 0;               // adapters loaded (<= max_loras)
  bool active_loras_hint = false;     // pass the batch's distinct adapters as num_active_loras
  std::vector<int> ranks;             // true rank per adapter, cycled over adapters
  int max_rank = 0;                   // padded rank r (>= every true rank)
  Popularity popularity;
  double no_lora_fraction = 0.0;      // share of requests without an adapter
  std::vector<int> none_slices;       // slices whose sub-LoRA is None (stays zero)
  float scale = 1.0f;
  bool add_inputs = true;
  int64_t offset_start = 0;
  kernels::DType dtype = kernels::DType::bf16;
  kernels::DType intermediate_dtype = kernels::DType::f32;  // shrink output buffer
  int tp = 1;
  bool fully_sharded = false;
  uint64_t seed = 0;
  // timing
  int warmup = 5;
  int iters = 20;
};

struct Scenario {
  std::string path;
  std::string name;
  std::string description;
  std::vector<Case> cases;
};

// Parse, validate and expand one scenario file. Any malformed content throws
// punica::Error(ErrorKind::usage) with a one-line message "<file>: <json path>: <what was expected>".
Scenario load_scenario(const std::string& path);
// Same, from text already read (path only names it in messages).
Scenario parse_scenario(const std::string& text, const std::string& path);
// The built-in default scenario (`punica-bench run` with no file): small, mixed adapters and ranks.
Scenario default_scenario();
// Known model presets (for validation and `punica-bench info`; op names: registry.h).
const std::vector<std::string>& known_models();

// ---- additions (scenario layer) ----
// Every scenario field in canonical order: the order in which lists cross (first = outermost)
// and in which declared axes appear in case ids. "description" (case-level note) is not listed.
const std::vector<std::string>& scenario_fields();
// SPEC §7.1 model presets. intermediate == 0: no dense MLP (MoE models: gate_up/down do not exist).
struct ModelPreset {
  std::string name;
  int64_t hidden = 0;
  int num_heads = 0, num_kv_heads = 0, head_dim = 0;
  int64_t intermediate = 0;
  int64_t vocab = 0;
  int num_experts = 0, top_k = 0;
  int64_t moe_intermediate = 0;
};
const ModelPreset* find_model(const std::string& name);  // nullptr when unknown
// "uniform" | "sorted" | "round_robin" | "zipf" (alpha 1) | "zipf:<alpha>" (as in case ids).
std::string popularity_name(const Popularity& p);

// `-a key=value` (DESIGN §3): replaces `key` in the defaults and in every case of the file, so it
// counts as a declared axis (it appears in the ids). value: JSON (`tp=[1,2]`, `add_inputs=true`),
// else a bare string (`dtype=fp16`), or an inclusive integer range `[a:b:step]`.
struct AxisOverride {
  std::string key;
  nlohmann::json value;
};
// Parses "key=value"; throws usage Error on a missing '=' or an unknown key.
AxisOverride parse_axis_override(const std::string& text);
Scenario load_scenario(const std::string& path, const std::vector<AxisOverride>& overrides);
Scenario parse_scenario(const std::string& text, const std::string& path,
                        const std::vector<AxisOverride>& overrides);
Scenario default_scenario(const std::vector<AxisOverride>& overrides);
// The JSON text of the built-in default scenario (what `punica-bench run` runs without a file).
const std::string& default_scenario_text();

// Deterministic batch layout from (seed, case id): which slot each adapter sits in, each
// request's slot (-1 = no adapter), each token's slot, and each slot's true rank (0 = empty).
struct BatchLayout {
  std::vector<int32_t> slot_rank;       // [max_loras]
  std::vector<int32_t> adapter_slot;    // [num_adapters]
  std::vector<int32_t> request_slot;    // [num_requests]
  std::vector<int32_t> token_slot;      // [num_tokens]
  int num_active_adapters = 0;          // distinct slots used by at least one token
};
BatchLayout make_layout(const Case& c);

}  // namespace punica::bench
