// Scenario layer tests: crossing, stable ids, model-preset shapes, usage errors (file + JSON path +
// what was expected), crossing-invalid skips, and the deterministic adapter/request layout that
// stands in for vLLM's LoRAMapping in every backend.
#include "apps/punica-bench/scenario.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <string>

#include "apps/punica-bench/registry.h"
#include "kernels/common/error.h"

namespace punica::bench {
namespace {

std::string doc(const std::string& defaults, const std::string& cases) {
  return R"({"schema": "punica-bench.scenario/1", "name": "t", "defaults": )" + defaults +
         R"(, "cases": )" + cases + "}";
}
Scenario parse(const std::string& text) { return parse_scenario(text, "mem.json"); }
Case one(const std::string& defaults, const std::string& case_obj) {
  Scenario s = parse(doc(defaults, "[" + case_obj + "]"));
  EXPECT_EQ(s.cases.size(), 1u);
  return s.cases.at(0);
}

// Throws a usage Error whose one-line message starts with "mem.json: <path>: " and contains want.
void expect_usage(const std::string& text, const std::string& path, const std::string& want) {
  try {
    parse(text);
    ADD_FAILURE() << "no error for: " << text;
  } catch (const Error& e) {
    std::string msg = e.what();
    EXPECT_EQ(e.kind(), ErrorKind::usage) << msg;
    EXPECT_EQ(msg.rfind("mem.json: " + path + ": ", 0), 0u) << "message: " << msg;
    EXPECT_NE(msg.find(want), std::string::npos) << "message: " << msg << "\nwanted: " << want;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
  }
}

const std::string kBase = R"({"max_loras": 4, "num_requests": 8, "hidden": 64, "slices": [32, 16, 16]})";

TEST(Scenario, DefaultScenarioIsSmallAndCoversEverySingleDeviceOp) {
  Scenario s = default_scenario();
  ASSERT_EQ(s.cases.size(), 14u);
  std::set<std::string> ops, ids;
  for (const auto& c : s.cases) {
    EXPECT_TRUE(c.skip_reason.empty()) << c.id << ": " << c.skip_reason;
    EXPECT_EQ(c.dtype, kernels::DType::bf16);
    EXPECT_EQ(c.max_loras, 6);
    EXPECT_EQ(c.num_adapters, 4);
    EXPECT_EQ(c.ranks, (std::vector<int>{8, 16, 32}));
    EXPECT_EQ(c.max_rank, 32);
    EXPECT_LE(c.num_tokens, 128);
    ops.insert(c.op);
    ids.insert(c.id);
  }
  EXPECT_EQ(ids.size(), s.cases.size());
  std::set<std::string> want;  // every entry that asks to be in it (the dense single-device ops)
  for (const OpSpec* o : registered_op_specs())
    if (o->in_default_scenario) want.insert(o->name);
  EXPECT_EQ(ops, want);
  EXPECT_GE(ops.size(), 7u);
  EXPECT_EQ(ops.count("layer"), 0u);
  EXPECT_EQ(s.cases[1].id,
            "decode/lora_shrink/hidden=512/slices=512x128x128/vocab=1024/out_features=8/"
            "phase=decode/num_requests=16/tokens_per_request=1/max_loras=6/num_adapters=4/"
            "ranks=8x16x32/popularity=uniform/no_lora_fraction=0.25/scale=0.5/dtype=bf16/seed=0");
  EXPECT_EQ(s.cases[7].name, "prefill");
  EXPECT_EQ(s.cases[7].num_tokens, 128);
  EXPECT_EQ(s.cases[7].phase, "prefill");
}

TEST(Scenario, ListsCrossInCanonicalOrder) {
  // tp and dtype cross (dtype comes first in the canonical order, so it is the outer loop);
  // slices/ranks given as plain lists are single values; ranks as a list of lists crosses.
  Scenario s = parse(doc(kBase, R"([{"name": "a", "op": "add_lora_linear", "tp": [1, 2],
      "dtype": ["fp16", "bf16", "fp32"], "ranks": [[8], [4, 16]]}])"));
  // Canonical order: ranks (outermost), dtype, tp (fastest).
  ASSERT_EQ(s.cases.size(), 12u);
  EXPECT_EQ(s.cases[0].slices, (std::vector<int64_t>{32, 16, 16}));
  for (int i = 0; i < 12; ++i) {
    const std::vector<int> want = i < 6 ? std::vector<int>{8} : std::vector<int>{4, 16};
    EXPECT_EQ(s.cases[size_t(i)].ranks, want) << i;
    EXPECT_EQ(s.cases[size_t(i)].max_rank, i < 6 ? 8 : 16) << i;
    const kernels::DType dt[3] = {kernels::DType::f16, kernels::DType::bf16, kernels::DType::f32};
    EXPECT_EQ(s.cases[size_t(i)].dtype, dt[(i / 2) % 3]) << i;
    EXPECT_EQ(s.cases[size_t(i)].tp, 1 + i % 2) << i;
  }
  EXPECT_EQ(s.cases[7].id, "a/add_lora_linear/hidden=64/slices=32x16x16/num_requests=8/max_loras=4/"
                           "ranks=4x16/dtype=fp16/tp=2");
  // op lists cross too; several case entries add up.
  Scenario s2 = parse(doc(kBase, R"([{"name": "a", "op": ["lora_shrink", "lora_expand"], "num_requests": [0, 1, 16]},
                                    {"name": "b", "op": "lora_meta", "popularity": ["uniform", "sorted", {"kind": "zipf", "zipf_alpha": 2}]}])"));
  EXPECT_EQ(s2.cases.size(), 9u);
  EXPECT_EQ(s2.cases[0].op, "lora_shrink");
  EXPECT_EQ(s2.cases[3].op, "lora_expand");
  EXPECT_EQ(s2.cases[8].popularity.kind, "zipf");
  EXPECT_DOUBLE_EQ(s2.cases[8].popularity.zipf_alpha, 2.0);
}

TEST(Scenario, StableIds) {
  Case c = one(R"({"dtype": "bfloat16", "seed": 7, "warmup": 2, "iters": 9})",
               R"({"name": "dec", "op": "add_lora_linear", "model": "llama-3-8b", "module": "qkv",
                   "num_requests": 16, "max_loras": 8, "ranks": [8, 16, 64],
                   "popularity": {"kind": "zipf", "zipf_alpha": 1.2}, "no_lora_fraction": 0.25,
                   "none_slices": [1], "add_inputs": false, "fully_sharded": false})");
  // name/op first, then every declared axis in canonical order; timing fields are not axes.
  EXPECT_EQ(c.id,
            "dec/add_lora_linear/model=llama-3-8b/module=qkv/num_requests=16/max_loras=8/"
            "ranks=8x16x64/popularity=zipf:1.2/no_lora_fraction=0.25/none_slices=1/add_inputs=0/"
            "dtype=bf16/fully_sharded=0/seed=7");
  EXPECT_EQ(c.warmup, 2);
  EXPECT_EQ(c.iters, 9);
  Case e = one("{}", R"({"name": "x", "op": "lora_expand", "slices": [64, 64], "num_tokens": 5,
                         "max_loras": 2, "none_slices": [], "scale": 1.0, "popularity": "zipf"})");
  EXPECT_EQ(e.id, "x/lora_expand/slices=64x64/num_tokens=5/max_loras=2/popularity=zipf/"
                  "none_slices=none/scale=1");
  EXPECT_FALSE(e.active_loras_hint);
  EXPECT_EQ(e.params.at("active_loras_hint"), false);
  // The active-adapter hint is an axis after num_adapters, in the id only where declared.
  Case h = one("{}", R"({"name": "h", "op": "lora_expand", "slices": [64], "num_tokens": 5, "max_loras": 32,
                         "num_adapters": 2, "active_loras_hint": true})");
  EXPECT_EQ(h.id, "h/lora_expand/slices=64/num_tokens=5/max_loras=32/num_adapters=2/active_loras_hint=1");
  EXPECT_TRUE(h.active_loras_hint);
  EXPECT_EQ(h.params.at("active_loras_hint"), true);
  // The shipped grid's first id (dashboards and compare match on it).
  Scenario g = load_scenario(std::string(PUNICA_SOURCE_DIR) + "/scenarios/ci_kernel_grid.json");
  EXPECT_EQ(g.cases.at(0).id,
            "general/lora_shrink/hidden=2049/num_slices=1/phase=prefill/num_requests=1/"
            "tokens_per_request=128/max_loras=1/ranks=1/popularity=uniform/no_lora_fraction=0/"
            "scale=0.5/add_inputs=1/dtype=fp16/intermediate_dtype=fp32/seed=0");
  // Same text, same ids (stable across parses).
  Scenario g2 = load_scenario(std::string(PUNICA_SOURCE_DIR) + "/scenarios/ci_kernel_grid.json");
  ASSERT_EQ(g.cases.size(), g2.cases.size());
  for (size_t i = 0; i < g.cases.size(); ++i) EXPECT_EQ(g.cases[i].id, g2.cases[i].id);
}

TEST(Scenario, EveryShippedScenarioLoads) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::path(PUNICA_SOURCE_DIR) / "scenarios";
  std::map<std::string, size_t> counts;
  for (const auto& ent : fs::directory_iterator(dir)) {
    if (ent.path().extension() != ".json") continue;
    SCOPED_TRACE(ent.path().string());
    Scenario s;
    ASSERT_NO_THROW(s = load_scenario(ent.path().string()));
    EXPECT_FALSE(s.cases.empty());
    EXPECT_EQ(s.path, ent.path().string());
    std::set<std::string> ids;
    for (const auto& c : s.cases) {
      EXPECT_TRUE(ids.insert(c.id).second) << c.id;
      EXPECT_EQ(c.file, s.path);
      EXPECT_TRUE(c.params.is_object());
      EXPECT_EQ(c.params["num_tokens"].get<int64_t>(), c.num_tokens);
      EXPECT_EQ(c.params["tp"].get<int>(), c.tp);
      EXPECT_GE(c.max_rank, *std::max_element(c.ranks.begin(), c.ranks.end()));
      EXPECT_LE(c.num_adapters, c.max_loras);
      if (c.op == "layer") {
        EXPECT_EQ(c.params["layer"].get<std::string>(), c.layer);
      }
    }
    counts[ent.path().filename().string()] = s.cases.size();
  }
  for (const char* f : {"smoke.json", "vllm_kernel_grid.json", "ci_kernel_grid.json",
                        "bench_lora_ops.json", "llama3_8b_decode.json", "llama3_8b_prefill.json",
                        "ci_layers.json", "layers_llama.json", "bench_sparse_slots.json", "ci_moe.json",
                        "bench_moe.json"})
    EXPECT_EQ(counts.count(f), 1u) << f;
  EXPECT_EQ(counts["vllm_kernel_grid.json"], 2u * 4 * 4 * 8 * 3 * 2 + 2u * 12 * 3 * 2);
  EXPECT_EQ(counts["bench_lora_ops.json"], 3u * 6 * (2 * 3 * 2 + 3 * 2 + 2));
  EXPECT_EQ(counts["bench_sparse_slots.json"], 2u * 3 * 3 * 3 * (2 * 2 + 2));  // (plain, hinted) x ops x T x adapters x shapes
  EXPECT_EQ(counts["ci_layers.json"], 152u);
  EXPECT_EQ(counts["ci_moe.json"], 96u);
  EXPECT_EQ(counts["bench_moe.json"], 3u * (2 * 5 * 2 + 2 * 2 * 2 + 2 * 2 * 2 + 2 * 3 + 2));  // 132
}

TEST(Scenario, SmokeCoversTheEdgeCases) {
  Scenario s = load_scenario(std::string(PUNICA_SOURCE_DIR) + "/scenarios/smoke.json");
  std::set<std::string> ops;
  bool t0 = false, t1 = false, all_none = false, odd = false, rank1 = false, unequal = false,
       none_slice = false, mixed = false, full = false;
  std::set<kernels::DType> dts;
  for (const auto& c : s.cases) {
    ops.insert(c.op);
    t0 |= c.num_tokens == 0;
    t1 |= c.num_tokens == 1;
    all_none |= c.no_lora_fraction == 1.0 && c.num_tokens > 0;
    odd |= c.hidden == 2049;
    rank1 |= std::count(c.ranks.begin(), c.ranks.end(), 1) > 0;
    unequal |= c.slices.size() > 1 && c.slices[0] != c.slices[1];
    none_slice |= !c.none_slices.empty();
    mixed |= std::set<int>(c.ranks.begin(), c.ranks.end()).size() > 1;
    full |= c.num_adapters == c.max_loras;
    dts.insert(c.dtype);
  }
  EXPECT_EQ(ops.size(), registered_ops().size());
  EXPECT_TRUE(t0 && t1 && all_none && odd && rank1 && unequal && none_slice && mixed && full);
  EXPECT_EQ(dts.size(), 3u);
}

// SPEC §7.1: deepseek-v2-lite gives the MoE sizes; its MLA attention makes qkv / o crossings skips.
TEST(Scenario, DeepSeekPresetIsMoeWithMlaSkips) {
  const ModelPreset* m = find_model("deepseek-v2-lite");
  ASSERT_NE(m, nullptr);
  EXPECT_EQ(m->hidden, 2048);
  EXPECT_EQ(m->num_experts, 64);
  EXPECT_EQ(m->top_k, 6);
  EXPECT_EQ(m->moe_intermediate, 1408);
  Scenario s = parse_scenario(R"({"schema": "punica-bench.scenario/1", "name": "d", "cases": [
      {"name": "a", "op": "lora_shrink", "model": "deepseek-v2-lite", "module": ["qkv", "o", "gate_up"],
       "num_requests": 2, "max_loras": 2},
      {"name": "l", "op": "layer", "layer": "qkv", "model": "deepseek-v2-lite", "module": "gate_up",
       "num_requests": 2, "max_loras": 2},
      {"name": "w", "op": "add_lora_w13", "model": "deepseek-v2-lite", "num_requests": 2, "max_loras": 2}]})",
                              "mem.json");
  ASSERT_EQ(s.cases.size(), 5u);
  EXPECT_NE(s.cases[0].skip_reason.find("multi-head latent attention"), std::string::npos);
  EXPECT_NE(s.cases[1].skip_reason.find("multi-head latent attention"), std::string::npos);
  EXPECT_TRUE(s.cases[2].skip_reason.empty()) << s.cases[2].skip_reason;  // the dense first layer's MLP
  EXPECT_NE(s.cases[3].skip_reason.find("multi-head latent attention"), std::string::npos);
  EXPECT_TRUE(s.cases[4].skip_reason.empty()) << s.cases[4].skip_reason;
  EXPECT_EQ(s.cases[4].slices, (std::vector<int64_t>{1408, 1408}));  // gate | up of the expert
}

TEST(Scenario, ModelPresetsGiveLayerShapes) {
  auto mod = [](const std::string& model, const std::string& module, const std::string& op) {
    return one(R"({"max_loras": 2, "num_requests": 1})", R"({"name": "m", "op": ")" + op +
                                                              R"(", "model": ")" + model +
                                                              R"(", "module": ")" + module + "\"}");
  };
  Case qkv = mod("llama-3-8b", "qkv", "add_lora_linear");
  EXPECT_EQ(qkv.hidden, 4096);
  EXPECT_EQ(qkv.slices, (std::vector<int64_t>{4096, 1024, 1024}));
  EXPECT_EQ(qkv.num_heads, 32);
  EXPECT_EQ(qkv.num_kv_heads, 8);
  EXPECT_EQ(qkv.head_dim, 128);
  Case o = mod("llama-3-70b", "o", "lora_shrink");
  EXPECT_EQ(o.hidden, 8192);
  EXPECT_EQ(o.slices, (std::vector<int64_t>{8192}));
  Case gu = mod("qwen2.5-7b", "gate_up", "add_lora_linear");
  EXPECT_EQ(gu.hidden, 3584);
  EXPECT_EQ(gu.slices, (std::vector<int64_t>{18944, 18944}));
  Case down = mod("gqa-tiny", "down", "lora_expand");
  EXPECT_EQ(down.hidden, 2816);
  EXPECT_EQ(down.slices, (std::vector<int64_t>{1024}));
  Case emb = mod("llama-3-8b", "embedding", "add_lora_embedding");
  EXPECT_EQ(emb.vocab, 128256);
  EXPECT_EQ(emb.hidden, 4096);
  EXPECT_EQ(emb.slices, (std::vector<int64_t>{4096}));
  Case lm = mod("qwen3-30b-a3b", "lm_head", "add_lora_logits");
  EXPECT_EQ(lm.vocab, 151936);
  EXPECT_EQ(lm.hidden, 2048);
  EXPECT_EQ(lm.slices, (std::vector<int64_t>{151936}));
  EXPECT_EQ(lm.params["module"], "lm_head");
  EXPECT_EQ(lm.params["model"], "qwen3-30b-a3b");
  // num_slices repeats hidden (vLLM's test grid); apply_lora_full_linear defaults to 8 labels.
  Case ns = one(kBase, R"({"name": "n", "op": "lora_expand", "hidden": 2049, "slices": null, "num_slices": 3})");
  EXPECT_EQ(ns.slices, (std::vector<int64_t>{2049, 2049, 2049}));
  Case fl = one(R"({"max_loras": 2, "num_requests": 3})", R"({"name": "f", "op": "apply_lora_full_linear", "hidden": 64})");
  EXPECT_EQ(fl.out_features, 8);
  EXPECT_EQ(fl.slices, (std::vector<int64_t>{8}));
  for (const auto& m : known_models()) ASSERT_NE(find_model(m), nullptr) << m;
  EXPECT_EQ(find_model("nope"), nullptr);
}

TEST(Scenario, BatchRules) {
  const std::string d = R"({"max_loras": 2, "hidden": 64, "slices": [64]})";
  Case a = one(d, R"({"name": "a", "op": "lora_shrink", "num_requests": 4, "tokens_per_request": 32})");
  EXPECT_EQ(a.num_tokens, 128);
  EXPECT_EQ(a.phase, "prefill");  // derived: more than one token per request
  Case b = one(d, R"({"name": "b", "op": "lora_shrink", "num_tokens": 7})");
  EXPECT_EQ(b.num_requests, 7);
  EXPECT_EQ(b.tokens_per_request, 1);
  EXPECT_EQ(b.phase, "decode");
  Case c = one(d, R"({"name": "c", "op": "lora_shrink", "num_tokens": 96, "tokens_per_request": 32, "phase": "prefill"})");
  EXPECT_EQ(c.num_requests, 3);
  Case z = one(d, R"({"name": "z", "op": "lora_shrink", "num_requests": 0, "tokens_per_request": 8})");
  EXPECT_EQ(z.num_tokens, 0);
  Case both = one(d, R"({"name": "c", "op": "lora_shrink", "num_tokens": 8, "num_requests": 2, "tokens_per_request": 4})");
  EXPECT_EQ(both.num_tokens, 8);
  Case nad = one(R"({"hidden": 64, "slices": [64], "num_requests": 1})", R"({"name": "n", "op": "lora_shrink", "num_adapters": 3})");
  EXPECT_EQ(nad.max_loras, 3);  // max_loras defaults to num_adapters and vice versa
}

TEST(Scenario, BadInputsAreUsageErrorsNamingFileAndPath) {
  const std::string ok_case = R"({"name": "a", "op": "lora_shrink"})";
  auto with = [&](const std::string& case_obj) { return doc(kBase, "[" + case_obj + "]"); };
  // Not JSON / wrong document shape.
  expect_usage("", "/", "empty file");
  expect_usage("  \n", "/", "empty file");
  expect_usage("{\"schema\": \"punica-bench.scenario/1\", \"cases\": [", "/", "expected valid JSON");
  expect_usage("not json at all", "/", "expected valid JSON");
  expect_usage(std::string("\x7f\x45\x4c\x46\x02\x01\x01\x00\x00\x00", 10), "/", "binary");
  expect_usage("[1, 2]", "/", "expected an object");
  expect_usage(R"({"name": "t", "cases": []})", "/schema", "missing required field");
  expect_usage(R"({"schema": "punica-bench.scenario/2", "name": "t", "cases": []})", "/schema",
               "unsupported schema \"punica-bench.scenario/2\" (expected \"punica-bench.scenario/1\")");
  expect_usage(R"({"schema": 1, "name": "t", "cases": []})", "/schema", "expected \"punica-bench.scenario/1\"");
  expect_usage(R"({"schema": "punica-bench.scenario/1", "cases": [{}]})", "/name", "missing required field");
  expect_usage(R"({"schema": "punica-bench.scenario/1", "name": "t"})", "/cases", "missing required field");
  expect_usage(R"({"schema": "punica-bench.scenario/1", "name": "t", "cases": []})", "/cases", "non-empty list");
  expect_usage(R"({"schema": "punica-bench.scenario/1", "name": "t", "cases": {}})", "/cases", "non-empty list");
  expect_usage(R"({"schema": "punica-bench.scenario/1", "name": "t", "cases": [], "extra": 1})", "/extra", "unknown key");
  expect_usage(doc(kBase, "[3]"), "/cases/0", "expected an object");
  expect_usage(doc(R"({"rank": 3})", "[" + ok_case + "]"), "/defaults/rank", "did you mean \"ranks\"");
  expect_usage(doc("[]", "[" + ok_case + "]"), "/defaults", "expected an object");
  // Unknown keys, with a suggestion.
  expect_usage(doc(kBase, "[" + ok_case + R"(, {"name": "b", "op": "lora_shrink", "rnak": 3}])"),
               "/cases/1/rnak", "unknown key (did you mean \"ranks\"?)");
  expect_usage(with(R"({"name": "a", "op": "lora_shrink", "zzzzzzzzzz": 3})"), "/cases/0/zzzzzzzzzz", "expected one of");
  // Missing required fields.
  expect_usage(with(R"({"op": "lora_shrink"})"), "/cases/0/name", "missing required field");
  expect_usage(with(R"({"name": "a"})"), "/cases/0/op", "missing required field (expected one of lora_meta|");
  expect_usage(doc(R"({"max_loras": 2})", R"([{"name": "a", "op": "lora_meta"}])"), "/cases/0", "missing required field num_requests (or num_tokens)");
  expect_usage(doc(R"({"num_requests": 2})", R"([{"name": "a", "op": "lora_meta"}])"), "/cases/0", "missing required field max_loras");
  expect_usage(doc(R"({"num_requests": 2, "max_loras": 2})", R"([{"name": "a", "op": "lora_shrink", "slices": [8]}])"), "/cases/0", "missing required field hidden");
  expect_usage(doc(R"({"num_requests": 2, "max_loras": 2})", R"([{"name": "a", "op": "add_lora_linear", "hidden": 8}])"), "/cases/0", "missing required field slices");
  expect_usage(doc(R"({"num_requests": 2, "max_loras": 2})", R"([{"name": "a", "op": "add_lora_logits", "hidden": 8}])"), "/cases/0", "missing required field vocab");
  expect_usage(with(R"({"name": "a", "op": "layer"})"), "/cases/0", "missing required field layer");
  expect_usage(with(R"({"name": "a", "op": "layer", "layer": "qkv"})"), "/cases/0", "num_heads, num_kv_heads and head_dim");
  // Wrong types and values.
  expect_usage(with(R"({"name": "a", "op": "lora_shrink", "hidden": "4096"})"), "/cases/0/hidden", "expected a positive integer, got string \"4096\"");
  expect_usage(with(R"({"name": "a", "op": "lora_shrink", "hidden": 4096.0})"), "/cases/0/hidden", "expected a positive integer, got number 4096.0");
  expect_usage(with(R"({"name": "a", "op": "lora_shrink", "hidden": 0})"), "/cases/0/hidden", "expected a positive integer, got integer 0");
  expect_usage(with(R"({"name": "a", "op": "lora_shrink", "hidden": -5})"), "/cases/0/hidden", "expected a positive integer");
  expect_usage(with(R"({"name": "a", "op": "lora_shrink", "num_requests": -1})"), "/cases/0/num_requests", "expected a non-negative integer");
  expect_usage(with(R"({"name": "a", "op": "lora_shrink", "slices": [32, 0]})"), "/cases/0/slices/1", "expected a positive integer");
  expect_usage(with(R"({"name": "a", "op": "lora_shrink", "ranks": [8, 0]})"), "/cases/0/ranks/1", "expected a positive integer");
  expect_usage(with(R"({"name": "a", "op": "lora_shrink", "ranks": []})"), "/cases/0/ranks", "non-empty list");
  expect_usage(with(R"({"name": "a", "op": "lora_shrink", "tp": [1, "2"]})"), "/cases/0/tp/1", "expected a positive integer");
  expect_usage(with(R"({"name": "a", "op": "lora_shrink", "tp": []})"), "/cases/0/tp", "non-empty list");
  expect_usage(with(R"({"name": "a", "op": "lora_shrink", "add_inputs": 1})"), "/cases/0/add_inputs", "expected true or false");
  expect_usage(with(R"({"name": "a", "op": "lora_shrink", "active_loras_hint": "yes"})"), "/cases/0/active_loras_hint",
               "expected true or false");
  expect_usage(with(R"({"name": "a", "op": "lora_meta", "active_loras_hint": true})"), "/cases/0/active_loras_hint",
               "expected active_loras_hint only with op lora_shrink, lora_expand or add_lora_linear");
  expect_usage(with(R"({"name": "a", "op": "lora_shrink", "no_lora_fraction": 1.5})"), "/cases/0/no_lora_fraction", "expected a number in [0, 1]");
  expect_usage(with(R"({"name": "a", "op": "lora_shrink", "seed": -1})"), "/cases/0/seed", "non-negative integer");
  expect_usage(with(R"({"name": "a/b", "op": "lora_shrink"})"), "/cases/0/name", "without '/'");
  expect_usage(with(R"({"name": ["a", "b"], "op": "lora_shrink"})"), "/cases/0/name", "cannot be a list");
  expect_usage(with(R"({"name": "a", "op": "lora_shrunk"})"), "/cases/0/op", "expected one of lora_meta|lora_shrink|");
  expect_usage(with(R"({"name": "a", "op": "lora_shrink", "model": "llama-4"})"), "/cases/0/model", "expected one of llama-3-8b|");
  expect_usage(with(R"({"name": "a", "op": "lora_shrink", "dtype": "fp8"})"), "/cases/0/dtype", "expected one of fp16|bf16|fp32");
  expect_usage(with(R"({"name": "a", "op": "lora_shrink", "intermediate_dtype": 16})"), "/cases/0/intermediate_dtype", "expected one of fp16|bf16|fp32");
  expect_usage(with(R"({"name": "a", "op": "layer", "layer": "diagonal"})"), "/cases/0/layer", "expected one of replicated|");
  expect_usage(with(R"({"name": "a", "op": "lora_shrink", "module": "q_proj"})"), "/cases/0/module", "expected one of qkv|o|");
  expect_usage(with(R"({"name": "a", "op": "lora_shrink", "phase": "chunked"})"), "/cases/0/phase", "expected one of prefill|decode");
  expect_usage(with(R"({"name": "a", "op": "lora_shrink", "popularity": "zipfian"})"), "/cases/0/popularity", "expected one of uniform|zipf|sorted|round_robin");
  expect_usage(with(R"({"name": "a", "op": "lora_shrink", "popularity": {"kind": "zipf", "alpha": 2}})"), "/cases/0/popularity/alpha", "unknown key");
  expect_usage(with(R"({"name": "a", "op": "lora_shrink", "popularity": {"kind": "zipf", "zipf_alpha": -1}})"), "/cases/0/popularity/zipf_alpha", "positive number");
  expect_usage(with(R"({"name": "a", "op": "lora_shrink", "popularity": {"zipf_alpha": 1}})"), "/cases/0/popularity/kind", "missing required field");
  // Inconsistent single values (errors; the same combination made by crossing is a skip).
  expect_usage(with(R"({"name": "a", "op": "lora_shrink", "ranks": [8, 64], "max_rank": 32})"), "/cases/0/ranks", "expected every rank <= max_rank 32, got rank 64");
  expect_usage(with(R"({"name": "a", "op": "lora_shrink", "num_adapters": 5})"), "/cases/0/num_adapters", "expected num_adapters <= max_loras 4, got 5");
  expect_usage(with(R"({"name": "a", "op": "lora_shrink", "none_slices": [3]})"), "/cases/0/none_slices", "expected none_slices indices < 3");
  expect_usage(with(R"({"name": "a", "op": "lora_shrink", "none_slices": [1, 1]})"), "/cases/0/none_slices", "distinct");
  expect_usage(with(R"({"name": "a", "op": "lora_shrink", "num_requests": null, "num_tokens": 7, "tokens_per_request": 2})"), "/cases/0/num_tokens", "multiple of tokens_per_request 2");
  expect_usage(with(R"({"name": "a", "op": "lora_shrink", "num_tokens": 7})"), "/cases/0/num_tokens", "expected num_tokens = num_requests * tokens_per_request = 8, got 7");
  expect_usage(with(R"({"name": "a", "op": "lora_shrink", "layer": "row"})"), "/cases/0/layer", "expected layer only with op layer");
  expect_usage(with(R"({"name": "a", "op": "lora_shrink", "module": "qkv"})"), "/cases/0/module", "expected a model preset alongside module");
  expect_usage(with(R"({"name": "a", "op": "add_lora_linear", "model": "llama-3-8b", "module": "qkv"})"), "/defaults/hidden", "expected hidden 4096 as module qkv of model llama-3-8b gives, got 64");
  expect_usage(with(R"({"name": "a", "op": "layer", "layer": "row"})"), "/defaults/slices", "expected 1 slice for layer row, got 3");
  expect_usage(with(R"({"name": "a", "op": "lora_shrink", "num_slices": 2})"), "/cases/0/num_slices", "expected num_slices to match the 3 slices");
  // Duplicate ids.
  expect_usage(doc(kBase, "[" + ok_case + "," + ok_case + "]"), "/cases/1",
               "duplicate case id \"a/lora_shrink/hidden=64/slices=32x16x16/num_requests=8/max_loras=4\" (also from /cases/0;");
  // Missing file.
  try {
    load_scenario("/nonexistent/dir/x.json");
    ADD_FAILURE() << "no error for a missing file";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::usage);
    EXPECT_EQ(std::string(e.what()).rfind("/nonexistent/dir/x.json: /: cannot open scenario file", 0), 0u) << e.what();
  }
}

TEST(Scenario, NullRemovesADefault) {
  // JSON null in a case is "not given": the field falls back to its rule (useful to unset a default).
  Case c = one(kBase, R"({"name": "a", "op": "lora_shrink", "slices": null, "num_slices": 2})");
  EXPECT_EQ(c.slices, (std::vector<int64_t>{64, 64}));
  EXPECT_EQ(c.id.find("/slices="), std::string::npos);
}

TEST(Scenario, CrossingInvalidCombinationsAreSkips) {
  auto reasons = [](const Scenario& s) {
    std::map<std::string, std::string> m;
    for (const auto& c : s.cases) m[c.id] = c.skip_reason;
    return m;
  };
  const std::string d = R"({"max_loras": 4, "num_requests": 4, "op": "layer"})";
  // fully sharded needs max_rank % tp == 0 (column family).
  Scenario fs = parse(doc(d, R"([{"name": "a", "model": "gqa-tiny", "module": "qkv", "layer": "merged_qkv",
                                  "ranks": [6], "tp": [1, 2, 4], "fully_sharded": [false, true]}])"));
  ASSERT_EQ(fs.cases.size(), 6u);
  EXPECT_EQ(fs.cases[0].skip_reason, "");
  EXPECT_EQ(fs.cases[1].skip_reason, "");  // tp 1
  EXPECT_EQ(fs.cases[2].skip_reason, "");  // tp 2, plain
  EXPECT_EQ(fs.cases[3].skip_reason, "");  // tp 2, 6 % 2 == 0
  EXPECT_EQ(fs.cases[4].skip_reason, "");  // tp 4 plain: kv heads 2 replicate, fine
  EXPECT_EQ(fs.cases[5].skip_reason, "fully sharded: max_rank 6 not divisible by tp 4");
  // q heads must divide by tp: qwen2.5-7b has 28 q heads.
  Scenario qh = parse(doc(d, R"([{"name": "q", "model": ["qwen2.5-7b", "llama-3-8b"], "module": "qkv",
                                  "layer": "qkv", "tp": [4, 8, 16]}])"));
  ASSERT_EQ(qh.cases.size(), 6u);
  EXPECT_EQ(qh.cases[0].skip_reason, "");
  EXPECT_EQ(qh.cases[1].skip_reason, "q heads 28 not divisible by tp 8");
  EXPECT_EQ(qh.cases[4].skip_reason, "");  // llama tp 8 == kv heads
  EXPECT_EQ(qh.cases[5].skip_reason, "");  // llama tp 16: kv heads replicate
  // MoE presets have no dense MLP; a module that does not fit the layer or op is a skip.
  Scenario mm = parse(doc(d, R"([{"name": "m", "model": ["mixtral-8x7b", "llama-3-8b"], "module": ["gate_up", "o"],
                                  "layer": "merged_column"}])"));
  ASSERT_EQ(mm.cases.size(), 4u);
  EXPECT_EQ(mm.cases[0].skip_reason, "model mixtral-8x7b has no dense MLP: module gate_up does not exist");
  EXPECT_EQ(mm.cases[1].skip_reason, "module o does not fit op layer (layer merged_column)");
  EXPECT_EQ(mm.cases[2].skip_reason, "");
  EXPECT_NE(mm.cases[3].skip_reason, "");
  // Sizes not divisible by tp; layers without a fully-sharded variant.
  Scenario dv = parse(doc(d, R"([{"name": "r", "hidden": [2048, 2049], "slices": [1024], "layer": "row", "tp": 2},
                                 {"name": "c", "hidden": 64, "slices": [[1024], [1023]], "layer": "column", "tp": 2},
                                 {"name": "v", "hidden": 64, "vocab": 1000, "layer": ["vocab_embedding", "logits"], "tp": 16, "fully_sharded": [false, true]}])"));
  auto r = reasons(dv);
  EXPECT_EQ(dv.cases[0].skip_reason, "");
  EXPECT_EQ(dv.cases[1].skip_reason, "input width (hidden) 2049 not divisible by tp 2");
  EXPECT_EQ(dv.cases[2].skip_reason, "");
  EXPECT_EQ(dv.cases[3].skip_reason, "output slice width 1023 not divisible by tp 2");
  EXPECT_EQ(dv.cases[4].skip_reason, "vocab 1000 not divisible by tp 16");
  EXPECT_EQ(dv.cases[5].skip_reason, "layer vocab_embedding has no fully-sharded variant");
  // Kernel ops run on one device.
  Case k = one(kBase, R"({"name": "k", "op": "lora_shrink", "tp": 2})");
  EXPECT_EQ(k.skip_reason, "tp > 1 applies to op=layer only (kernel ops run on one device)");
  // rank > max_rank and num_adapters > max_loras: errors when written, skips when crossed.
  Scenario rk = parse(doc(kBase, R"([{"name": "a", "op": "lora_shrink", "ranks": [[8], [64]], "max_rank": 32},
                                     {"name": "b", "op": "lora_shrink", "num_adapters": [2, 8]}])"));
  ASSERT_EQ(rk.cases.size(), 4u);
  EXPECT_EQ(rk.cases[0].skip_reason, "");
  EXPECT_EQ(rk.cases[1].skip_reason, "expected every rank <= max_rank 32, got rank 64");
  EXPECT_EQ(rk.cases[2].skip_reason, "");
  EXPECT_EQ(rk.cases[3].skip_reason, "expected num_adapters <= max_loras 4, got 8");
  // Every case of the shipped Llama layer sweep divides cleanly (no skips).
  Scenario ll = load_scenario(std::string(PUNICA_SOURCE_DIR) + "/scenarios/layers_llama.json");
  for (const auto& c : ll.cases) EXPECT_EQ(c.skip_reason, "") << c.id;
}

TEST(Scenario, LayoutIsDeterministic) {
  Scenario s = parse(doc(R"({"max_loras": 8, "num_adapters": 5, "ranks": [8, 16, 64], "num_requests": 64,
                            "tokens_per_request": 3, "no_lora_fraction": 0.25, "hidden": 64, "slices": [64]})",
                         R"([{"name": "a", "op": "lora_shrink", "seed": [1, 2]}, {"name": "b", "op": "lora_shrink", "seed": 1}])"));
  ASSERT_EQ(s.cases.size(), 3u);
  BatchLayout a1 = make_layout(s.cases[0]), a1b = make_layout(s.cases[0]);
  EXPECT_EQ(a1.slot_rank, a1b.slot_rank);
  EXPECT_EQ(a1.adapter_slot, a1b.adapter_slot);
  EXPECT_EQ(a1.request_slot, a1b.request_slot);
  EXPECT_EQ(a1.token_slot, a1b.token_slot);
  Scenario again = parse(doc(R"({"max_loras": 8, "num_adapters": 5, "ranks": [8, 16, 64], "num_requests": 64,
                            "tokens_per_request": 3, "no_lora_fraction": 0.25, "hidden": 64, "slices": [64]})",
                         R"([{"name": "a", "op": "lora_shrink", "seed": [1, 2]}])"));
  EXPECT_EQ(make_layout(again.cases[0]).request_slot, a1.request_slot);
  BatchLayout a2 = make_layout(s.cases[1]);  // other seed
  EXPECT_NE(a2.request_slot, a1.request_slot);
  BatchLayout b1 = make_layout(s.cases[2]);  // other case id, same seed
  EXPECT_NE(b1.request_slot, a1.request_slot);
  // Shape of the layout.
  ASSERT_EQ(a1.slot_rank.size(), 8u);
  ASSERT_EQ(a1.adapter_slot.size(), 5u);
  ASSERT_EQ(a1.request_slot.size(), 64u);
  ASSERT_EQ(a1.token_slot.size(), 192u);
  for (size_t t = 0; t < a1.token_slot.size(); ++t) EXPECT_EQ(a1.token_slot[t], a1.request_slot[t / 3]);
  EXPECT_EQ(std::count(a1.request_slot.begin(), a1.request_slot.end(), -1), 16);  // round(0.25 * 64)
}

TEST(Scenario, LayoutSlotsRanksAndEmptySlots) {
  Case c = one(R"({"hidden": 64, "slices": [64]})",
               R"({"name": "a", "op": "lora_shrink", "max_loras": 6, "num_adapters": 4, "ranks": [8, 16, 32],
                   "max_rank": 64, "num_requests": 40, "popularity": "round_robin"})");
  BatchLayout l = make_layout(c);
  std::set<int> used(l.adapter_slot.begin(), l.adapter_slot.end());
  EXPECT_EQ(used.size(), 4u);  // distinct slots
  for (int s : used) EXPECT_TRUE(s >= 0 && s < 6);
  EXPECT_EQ(l.adapter_slot[0], 5);  // adapter 0 takes the last slot
  for (int a = 0; a < 4; ++a) EXPECT_EQ(l.slot_rank[size_t(l.adapter_slot[size_t(a)])], c.ranks[size_t(a) % 3]);
  int empty = 0;
  for (int s = 0; s < 6; ++s)
    if (!used.count(s)) {
      EXPECT_EQ(l.slot_rank[size_t(s)], 0);
      ++empty;
    }
  EXPECT_EQ(empty, 2);
  EXPECT_EQ(l.num_active_adapters, 4);
  // Every slot loaded: a permutation of all slots.
  Case f = one(R"({"hidden": 64, "slices": [64]})", R"({"name": "f", "op": "lora_shrink", "max_loras": 7, "num_requests": 3})");
  BatchLayout lf = make_layout(f);
  std::vector<int> sorted(lf.adapter_slot.begin(), lf.adapter_slot.end());
  std::sort(sorted.begin(), sorted.end());
  EXPECT_EQ(sorted, (std::vector<int>{0, 1, 2, 3, 4, 5, 6}));
  for (int r : lf.slot_rank) EXPECT_EQ(r, 16);  // default ranks [16]
  EXPECT_LE(lf.num_active_adapters, 3);
  // T = 0: nothing active.
  Case z = one(R"({"hidden": 64, "slices": [64]})", R"({"name": "z", "op": "lora_shrink", "max_loras": 4, "num_requests": 0})");
  BatchLayout lz = make_layout(z);
  EXPECT_TRUE(lz.token_slot.empty());
  EXPECT_EQ(lz.num_active_adapters, 0);
  EXPECT_EQ(lz.slot_rank.size(), 4u);
}

TEST(Scenario, LayoutPopularity) {
  const std::string d = R"({"hidden": 64, "slices": [64], "max_loras": 8, "num_adapters": 5})";
  auto lay = [&](const std::string& extra) {
    return make_layout(one(d, R"({"name": "p", "op": "lora_meta")" + extra + "}"));
  };
  // round_robin: request i -> adapter i % n.
  BatchLayout rr = lay(R"(, "num_requests": 23, "popularity": "round_robin")");
  for (int i = 0; i < 23; ++i) EXPECT_EQ(rr.request_slot[size_t(i)], rr.adapter_slot[size_t(i % 5)]) << i;
  EXPECT_EQ(rr.num_active_adapters, 5);
  // sorted: contiguous, equal (+-1) chunks in adapter order.
  BatchLayout so = lay(R"(, "num_requests": 23, "popularity": "sorted")");
  std::vector<int> chunk(5, 0);
  for (int i = 0; i < 23; ++i) {
    int a = int(std::find(so.adapter_slot.begin(), so.adapter_slot.end(), so.request_slot[size_t(i)]) - so.adapter_slot.begin());
    ASSERT_LT(a, 5);
    if (i > 0) {
      int prev = int(std::find(so.adapter_slot.begin(), so.adapter_slot.end(), so.request_slot[size_t(i - 1)]) - so.adapter_slot.begin());
      EXPECT_TRUE(a == prev || a == prev + 1) << i;
    }
    ++chunk[size_t(a)];
  }
  for (int n : chunk) EXPECT_TRUE(n == 4 || n == 5) << n;
  // sorted with no-LoRA requests: they come first, then the adapter chunks.
  BatchLayout sn = lay(R"(, "num_requests": 20, "popularity": "sorted", "no_lora_fraction": 0.25)");
  for (int i = 0; i < 5; ++i) EXPECT_EQ(sn.request_slot[size_t(i)], -1);
  for (int i = 5; i < 20; ++i) EXPECT_GE(sn.request_slot[size_t(i)], 0);
  // no_lora_fraction 1 -> every request -1; 0 -> none.
  BatchLayout all = lay(R"(, "num_requests": 50, "no_lora_fraction": 1.0, "tokens_per_request": 2)");
  for (int s : all.token_slot) EXPECT_EQ(s, -1);
  EXPECT_EQ(all.num_active_adapters, 0);
  BatchLayout nn = lay(R"(, "num_requests": 50, "no_lora_fraction": 0)");
  for (int s : nn.request_slot) EXPECT_GE(s, 0);
  // uniform: every adapter shows up in a large batch.
  BatchLayout un = lay(R"(, "num_requests": 2000)");
  EXPECT_EQ(un.num_active_adapters, 5);
  // zipf: skewed toward adapter 0 (P(a) ~ 1/(a+1)^alpha).
  BatchLayout zf = lay(R"(, "num_requests": 4000, "popularity": {"kind": "zipf", "zipf_alpha": 1.5})");
  std::map<int, int> cnt;
  for (int s : zf.request_slot) ++cnt[s];
  int c0 = cnt[zf.adapter_slot[0]], c1 = cnt[zf.adapter_slot[1]], c4 = cnt[zf.adapter_slot[4]];
  EXPECT_GT(c0, c1);
  EXPECT_GT(c1, c4);
  EXPECT_GT(c0, 4 * c4);
  EXPECT_NEAR(double(c0) / 4000, 1.0 / (1 + std::pow(2, -1.5) + std::pow(3, -1.5) + std::pow(4, -1.5) + std::pow(5, -1.5)), 0.04);
  // No adapters loaded: every request is -1.
  BatchLayout none = make_layout(one(d, R"({"name": "p", "op": "lora_meta", "num_adapters": 0, "num_requests": 9})"));
  for (int s : none.request_slot) EXPECT_EQ(s, -1);
}

TEST(Scenario, AxisOverrides) {
  AxisOverride a = parse_axis_override("tp=[1,2]");
  EXPECT_EQ(a.key, "tp");
  EXPECT_EQ(a.value, nlohmann::json::array({1, 2}));
  EXPECT_EQ(parse_axis_override("dtype=fp16").value, "fp16");
  EXPECT_EQ(parse_axis_override("num_requests=[1:16:5]").value, nlohmann::json::array({1, 6, 11, 16}));
  EXPECT_EQ(parse_axis_override("add_inputs=false").value, false);
  EXPECT_THROW(parse_axis_override("tp"), Error);
  EXPECT_THROW(parse_axis_override("rnak=3"), Error);
  Scenario s = parse_scenario(doc(kBase, R"([{"name": "a", "op": "lora_shrink", "dtype": "fp32"}])"), "mem.json",
                              {parse_axis_override("dtype=[fp16,bf16]")});
  ASSERT_EQ(s.cases.size(), 2u);  // the override replaces the case's own value
  EXPECT_NE(s.cases[0].id.find("/dtype=fp16"), std::string::npos);
  try {
    parse_scenario(doc(kBase, R"([{"name": "a", "op": "lora_shrink"}])"), "mem.json", {parse_axis_override("tp=0")});
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()).rfind("mem.json: -a tp: expected a positive integer", 0), 0u) << e.what();
  }
  EXPECT_EQ(default_scenario({parse_axis_override("num_requests=1")}).cases.size(), 14u);
}

}  // namespace
}  // namespace punica::bench
