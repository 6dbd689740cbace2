// `punica-bench schema`: the JSON schema of scenario files (scenarios/schema/scenario.schema.json),
// generated from the shared fields below and the fields and op names of the registry, so it cannot
// drift from what the parser accepts (a test compares the committed file with this output).
#include "apps/punica-bench/schema.h"

#include <string>
#include <vector>

#include "apps/punica-bench/registry.h"
#include "apps/punica-bench/scenario.h"

namespace punica::bench {
namespace {

using ojson = nlohmann::ordered_json;

// One value's schema of each shared field (scenario.cpp enforces them); a list-valued field gives
// its element's schema and the shortest list one value may be.
struct SharedField {
  const char* name;
  bool list_valued;
  const char* description;
  const char* schema;
};
const SharedField kShared[] = {
    {"model", false,
     R"(SPEC §7.1 preset: supplies hidden, vocab and the heads unless given.)",
     R"({"type": "string", "enum": ["llama-3-8b", "llama-3-70b", "qwen2.5-7b", "mixtral-8x7b", "qwen3-30b-a3b", "gqa-tiny"]})"},
    {"module", false,
     R"(Needs model. Derives K and the output slices: qkv K=hidden [q*hd, kv*hd, kv*hd]; o K=q*hd [hidden]; gate_up K=hidden [I, I]; down K=I [hidden]; embedding vocab x hidden, [hidden]; lm_head K=hidden, [vocab]. Explicit hidden/slices/vocab must agree. gate_up/down of an MoE preset (no dense MLP) is a skip; a module that does not fit the op or layer is a skip.)",
     R"({"type": "string", "enum": ["qkv", "o", "gate_up", "down", "embedding", "lm_head"]})"},
    {"hidden", false,
     R"(K, the input width (embedding: the embedding dim). With num_slices also the width of every output slice.)",
     R"({"type": "integer", "minimum": 1})"},
    {"slices", true,
     R"(Output slice widths N_s (full, unsharded).)",
     R"({"element": {"type": "integer", "minimum": 1}, "minItems": 1})"},
    {"num_slices", false,
     R"(Without slices (and module): slices = num_slices copies of hidden (vLLM's test grid). With slices: must equal their count.)",
     R"({"type": "integer", "minimum": 1, "maximum": 64})"},
    {"num_heads", false,
     R"(q heads (qkv layers without a model).)",
     R"({"type": "integer", "minimum": 1})"},
    {"num_kv_heads", false,
     R"(kv heads (qkv layers without a model).)",
     R"({"type": "integer", "minimum": 1})"},
    {"head_dim", false,
     R"(Head size (qkv layers without a model).)",
     R"({"type": "integer", "minimum": 1})"},
    {"vocab", false,
     R"(Vocabulary (embedding, logits).)",
     R"({"type": "integer", "minimum": 1})"},
    {"phase", false,
     R"(Default: prefill when tokens_per_request > 1, else decode.)",
     R"({"type": "string", "enum": ["prefill", "decode"]})"},
    {"num_requests", false,
     R"(Requests (sequences) in the batch; num_tokens = num_requests * tokens_per_request. 0 = an empty batch (T = 0).)",
     R"({"type": "integer", "minimum": 0})"},
    {"tokens_per_request", false,
     R"(Tokens of each request (default 1). Every token of a request uses the request's adapter.)",
     R"({"type": "integer", "minimum": 1})"},
    {"num_tokens", false,
     R"(Alternative to num_requests: num_requests = num_tokens / tokens_per_request (must divide). With num_requests too, it must equal the product.)",
     R"({"type": "integer", "minimum": 0})"},
    {"max_loras", false,
     R"(Adapter slots L. Default: num_adapters. One of the two is required.)",
     R"({"type": "integer", "minimum": 1})"},
    {"num_adapters", false,
     R"(Adapters loaded (<= max_loras); default max_loras. Fewer than max_loras leaves empty slots (rank 0).)",
     R"({"type": "integer", "minimum": 0})"},
    {"active_loras_hint", false,
     R"(Pass the batch's distinct adapters to the op as num_active_loras (vLLM's specialize-active-lora: the host knows them, and the launch rules and grids plan for them instead of every slot). Default false (not given: every slot). Only with op lora_shrink, lora_expand or add_lora_linear.)",
     R"({"type": "boolean"})"},
    {"ranks", true,
     R"(True rank of each adapter, cycled over the adapters (adapter a has ranks[a % len]). Default [16].)",
     R"({"element": {"type": "integer", "minimum": 1}, "minItems": 1})"},
    {"max_rank", false,
     R"(Padded rank r of the stacked buffers; default max(ranks); must be >= every rank.)",
     R"({"type": "integer", "minimum": 1})"},
    {"popularity", false,
     R"(How requests pick adapters: uniform (hash), zipf (P(a) ~ 1/(a+1)^alpha), sorted (contiguous equal chunks in adapter order, no-LoRA requests first), round_robin (the j-th request with LoRA -> adapter j % n).)",
     R"({"oneOf": [{"type": "string", "enum": ["uniform", "zipf", "sorted", "round_robin"]}, {"type": "object", "additionalProperties": false, "required": ["kind"], "properties": {"kind": {"type": "string", "enum": ["uniform", "zipf", "sorted", "round_robin"]}, "zipf_alpha": {"type": "number", "exclusiveMinimum": 0, "description": "P(adapter a) ~ 1/(a+1)^alpha; only with kind zipf; default 1."}}}]})"},
    {"no_lora_fraction", false,
     R"(Share of requests with no adapter (slot -1): exactly round(f * num_requests) of them, chosen by hash (the first ones under sorted). Default 0.)",
     R"({"type": "number", "minimum": 0, "maximum": 1})"},
    {"none_slices", true,
     R"(Slice indices whose sub-LoRA is None (its B stays zero). Default [] (id: none).)",
     R"({"element": {"type": "integer", "minimum": 0}, "minItems": 0})"},
    {"scale", false,
     R"(LoRA scaling applied by shrink; default 1.0 (vLLM's kernel tests use 0.5).)",
     R"({"type": "number"})"},
    {"add_inputs", false,
     R"(Expand accumulates into y (true, default) or overwrites it.)",
     R"({"type": "boolean"})"},
    {"offset_start", false,
     R"(Expand's first output column; default 0.)",
     R"({"type": "integer", "minimum": 0})"},
    {"dtype", false,
     R"(Activation/weight dtype; default bf16. Ids use fp16|bf16|fp32.)",
     R"({"type": "string", "enum": ["fp16", "bf16", "fp32", "f16", "f32", "float16", "float32", "half", "bfloat16"]})"},
    {"intermediate_dtype", false,
     R"(Shrink output buffer dtype; default fp32.)",
     R"({"type": "string", "enum": ["fp16", "bf16", "fp32", "f16", "f32", "float16", "float32", "half", "bfloat16"]})"},
    {"tp", false,
     R"(Tensor-parallel degree (op=layer only; > 1 on a kernel op is a skip). Sizes that do not divide are skips: column/merged_column slice widths, q heads (kv heads replicate when tp > kv heads and tp % kv == 0), row K (and N when fully sharded), vocab.)",
     R"({"type": "integer", "minimum": 1})"},
    {"fully_sharded", false,
     R"(S-LoRA variants (SPEC §5.7); column family needs max_rank % tp == 0; replicated/vocab_embedding/logits have none (skip).)",
     R"({"type": "boolean"})"},
    {"seed", false,
     R"(Seed of the counter-based generator; inputs and layout come from (seed, case id). Default 0.)",
     R"({"type": "integer", "minimum": 0})"},
    {"warmup", false,
     R"(Warm-up iterations (timing only: not part of the case id).)",
     R"({"type": "integer", "minimum": 0})"},
    {"iters", false,
     R"(Timed iterations (timing only: not part of the case id).)",
     R"({"type": "integer", "minimum": 1})"},
};

const char* kPlain = " A list of values crosses.";
const char* kList = " One value is a list (or an integer for a one-element list); a list of lists crosses.";

ojson null_schema() {
  return {{"type", "null"},
          {"description", "null = not given: the field falls back to its default rule (removes a value from defaults)."}};
}

// A field's property: one value or a list that crosses (a list of lists for list-valued fields).
ojson property(const std::string& description, bool list_valued, const ojson& sch) {
  ojson p;
  if (!list_valued) {
    p["description"] = description + kPlain;
    p["anyOf"] = {{{"oneOf", {sch, {{"type", "array"}, {"minItems", 1}, {"items", sch}}}}}, null_schema()};
  } else {
    const ojson& el = sch.contains("element") ? sch["element"] : sch;
    const int min_items = sch.contains("minItems") ? sch["minItems"].get<int>() : 1;
    ojson one = {{"type", "array"}, {"minItems", min_items}, {"items", el}};
    ojson cross = {{"type", "array"}, {"minItems", 1}, {"items", {{"oneOf", {el, one}}}}, {"contains", {{"type", "array"}}}};
    p["description"] = description + kList;
    p["anyOf"] = {{{"oneOf", {el, one, cross}}}, null_schema()};
  }
  return p;
}

ojson field_properties(bool in_case) {
  std::vector<std::string> ops = registered_ops();
  std::vector<std::string> models = known_models();
  ojson by_name = ojson::object();
  by_name["name"] = {{"type", "string"}, {"pattern", "^[^/= \\t\\n]+$"},
                     {"description", "Case name: the first component of every case id. Never a list."}};
  ojson op_one = {{"type", "string"}, {"enum", ops}};
  by_name["op"] = {{"description", std::string("The op (DESIGN §2 registry; `punica-bench info` lists each).") + kPlain},
                   {"oneOf", {op_one, {{"type", "array"}, {"minItems", 1}, {"items", op_one}}}}};
  for (const auto& f : kShared) {
    ojson sch = ojson::parse(f.schema);
    if (std::string(f.name) == "model") sch["enum"] = models;
    by_name[f.name] = property(f.description, f.list_valued, sch);
  }
  for (const auto& f : registered_op_fields()) {
    std::string d = f.description;
    std::vector<std::string> owners = field_owners(f.name);
    if (!owners.empty()) {
      d += " Only with op";
      for (size_t i = 0; i < owners.size(); ++i) d += (i ? ", " : " ") + owners[i];
      d += ".";
    }
    by_name[f.name] = property(d, f.list_valued, ojson::parse(f.value_schema.dump()));
  }
  ojson props = ojson::object();
  for (const auto& k : scenario_fields()) props[k] = by_name.at(k);
  if (in_case) props["description"] = {{"type", "string"}, {"description", "A note on the case; not an axis."}};
  return props;
}

}  // namespace

std::string scenario_schema_text() {
  ojson s;
  s["$schema"] = "https://json-schema.org/draft/2020-12/schema";
  s["$id"] = "punica-bench.scenario/1";
  s["title"] = "punica-bench scenario";
  s["description"] =
      "Generated by `punica-bench schema` from apps/punica-bench/schema.cpp and the op registry; the parser "
      "(apps/punica-bench/scenario.cpp and each op's entry) enforces it (`punica-bench validate`). Each case = "
      "defaults merged with the case (the case wins; null in a case removes a default). Any field may be a list: "
      "lists cross as a cartesian product, the first field of the canonical order (the order of the properties "
      "below) outermost. List-valued fields (slices, ranks, none_slices, ...) cross only as a list of lists. Case "
      "id = <name>/<op>/key=value/... over every declared field (present in defaults, the case or a -a override) "
      "except name, op, warmup and iters, in canonical order; booleans 0/1, lists joined with 'x' (empty: none), "
      "popularity as kind or zipf:<alpha>, numbers in shortest form (1.0 -> 1). Duplicate ids are an error. A bad "
      "single value (wrong type, negative or zero size, unknown key/op/model/dtype, rank > max_rank, num_adapters > "
      "max_loras, a field the op does not take) is an error naming the file and JSON path (exit 2); a combination "
      "that only crossing lists produced (and any tp/module/layer applicability rule) is a skip with its reason. "
      "Layout (make_layout): adapter a sits in slot perm[a] of a hashed permutation of the slots, adapter 0 always "
      "in the last slot; empty slots have rank 0.";
  s["type"] = "object";
  s["additionalProperties"] = false;
  s["required"] = {"schema", "name", "cases"};
  ojson props = ojson::object();
  props["schema"] = {{"type", "string"},
                     {"pattern", "^punica-bench\\.scenario/1(\\.[0-9]+)?$"},
                     {"description", "Major version 1; minor versions (additions) accepted."}};
  props["name"] = {{"type", "string"}, {"minLength", 1}};
  props["description"] = {{"type", "string"}};
  props["defaults"] = {{"type", "object"}, {"additionalProperties", false}, {"properties", field_properties(false)}};
  props["cases"] = {{"type", "array"},
                    {"minItems", 1},
                    {"items", {{"type", "object"}, {"additionalProperties", false}, {"properties", field_properties(true)}}}};
  s["properties"] = props;
  return s.dump(2) + "\n";
}

}  // namespace punica::bench
