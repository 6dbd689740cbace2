// Unit tests of `punica-bench targets` (targets.h) on small synthetic result documents whose
// expected verdicts follow from the issues' definitions by hand.
#include <gtest/gtest.h>
#include <string>
#include "apps/punica-bench/targets.h"
#include "kernels/common/error.h"

using namespace punica;
using namespace punica::bench;

namespace {
// An op case: floor, copy fraction (cold), cold median, back-to-back time, copy_batch_fraction.
nlohmann::json op_case(const std::string& op, double floor_us, double copyf, double cold_us, double batch_us,
                       double copy_batchf = 0.6) {
  return {{"id", "s/" + op + "/x=1"}, {"op", op}, {"status", "pass"},
          {"work", {{"floor_us", floor_us}}},
          {"metrics", {{"copy_fraction", copyf}, {"copy_batch_fraction", copy_batchf}}},
          {"timing", {{"time_us", {{"median", cold_us}}}, {"batch_time_us", batch_us}}}};
}
nlohmann::json layer_case(const std::string& phase, bool fs, double lora_us, nlohmann::json timing_extra, double lff = 0.5) {
  const std::string id = phase + "_qkv/layer/model=m/module=qkv/phase=" + phase + "/tp=2/fully_sharded=" + (fs ? "1" : "0") + "/seed=0";
  nlohmann::json t = {{"lora_us", lora_us}};
  for (auto& [k, v] : timing_extra.items()) t[k] = v;
  return {{"id", id}, {"op", "layer"}, {"status", "pass"},
          {"params", {{"phase", phase}, {"module", "qkv"}, {"tp", 2}, {"fully_sharded", fs}, {"num_tokens", 8192},
                      {"max_loras", 8}, {"ranks", {16}}}},
          {"metrics", {{"lora_floor_fraction", lff}}}, {"timing", t}};
}
nlohmann::json doc(nlohmann::json cases) {
  return {{"schema", "punica-bench.result/1"}, {"tool", {{"git_sha", "abc"}}},
          {"run", {{"ceilings", {{"graph_node_us", 0.5}}}}}, {"cases", cases}};
}
const TargetRow* find(const TargetsReport& r, const std::string& name, const std::string& group) {
  for (const auto& row : r.rows)
    if (row.name == name && row.group == group) return &row;
  return nullptr;
}
}  // namespace

TEST(Targets, OpCases) {
  // dense_prefill (floor >= 10): copy fraction >= 0.75; dense_decode (floor < 10): copy_batch_fraction >= 0.5
  auto d = doc({op_case("lora_shrink", 20, 0.8, 10, 26),           // prefill met
                op_case("lora_expand", 20, 0.5, 12, 30),           // prefill missed
                op_case("add_lora_linear", 5, 0.3, 21, 8, 0.4)});  // no prefill target (floor < 10), decode missed;
                                                                   // chain: 21 < 22 cold, 8 < 56 batch
  const TargetsReport r = evaluate_targets({d}, {}, true);
  ASSERT_NE(find(r, "dense_prefill", "lora_shrink"), nullptr);
  EXPECT_EQ(find(r, "dense_prefill", "lora_shrink")->met, 1);
  EXPECT_EQ(find(r, "dense_prefill", "lora_expand")->met, 0);
  EXPECT_EQ(find(r, "dense_prefill", "add_lora_linear"), nullptr);
  EXPECT_EQ(find(r, "dense_decode", "lora_shrink"), nullptr);
  EXPECT_EQ(find(r, "dense_decode", "add_lora_linear")->met, 0);
  EXPECT_EQ(find(r, "linear_chain_cold", "add_lora_linear")->met, 1);
  EXPECT_EQ(find(r, "linear_chain_batch", "add_lora_linear")->met, 1);
  EXPECT_EQ(find(r, "one_adapter_expand", "lora_expand"), nullptr);  // no params, no cuBLAS baseline
  EXPECT_EQ(r.cases, 5);
  EXPECT_EQ(r.met, 3);
  EXPECT_NE(r.text.find("missed dense_prefill  s/lora_expand/x=1: copy fraction 0.500 < 0.750"), std::string::npos)
      << r.text;
  EXPECT_NE(r.text.find("missed dense_decode  s/add_lora_linear/x=1: copy_batch_fraction 0.400 < 0.500"),
            std::string::npos)
      << r.text;
  EXPECT_EQ(r.doc["schema"], "punica-bench.targets/1");
  // a slower add_lora_linear loses the chain comparison
  auto d2 = doc({op_case("lora_shrink", 20, 0.9, 10, 26), op_case("lora_expand", 20, 0.5, 12, 30),
                 op_case("add_lora_linear", 5, 0.3, 23, 60)});
  const TargetsReport r2 = evaluate_targets({d2}, {"linear_chain_cold", "linear_chain_batch"}, false);
  EXPECT_EQ(r2.rows.size(), 2u);
  EXPECT_EQ(r2.met, 0);
}

TEST(Targets, DensePrefillFlopTermAndOneAdapterExpand) {
  // gemm 100 TFLOP/s: 4e9 FLOPs = 40 us > floor 20 us: the FLOP term over the median, >= 0.7
  auto flop = op_case("lora_shrink", 20, 0.1, 50, 60);  // 40 / 50 = 0.8: met although the copy fraction is 0.1
  flop["work"]["flops"] = 4e9;
  auto flop_missed = flop;
  flop_missed["timing"]["time_us"]["median"] = 80.0;  // 0.5
  // one slice, one adapter expands: cold <= 1.03 x cuBLAS's accumulating GEMM
  auto expand = [](int adapters, int slices, double cold, double cublas) {
    auto c = op_case("lora_expand", 5, 0.5, cold, 8);
    c["params"] = {{"num_adapters", adapters}, {"num_slices", slices}, {"num_tokens", 64}};
    c["baseline"] = {{"cublas_us", cublas}};
    return c;
  };
  auto d = doc({flop, flop_missed, expand(1, 1, 10.2, 10), expand(1, 1, 10.4, 10), expand(8, 1, 30, 10),
                expand(1, 3, 30, 10)});
  d["run"]["ceilings"]["gemm_bf16_tflops"] = 100.0;
  const TargetsReport r = evaluate_targets({d}, {"dense_prefill", "one_adapter_expand"}, true);
  const TargetRow* p = find(r, "dense_prefill", "lora_shrink");
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(p->cases, 2);
  EXPECT_EQ(p->met, 1);
  EXPECT_NE(r.text.find("FLOP floor fraction 0.500 < 0.700"), std::string::npos) << r.text;
  const TargetRow* e = find(r, "one_adapter_expand", "lora_expand");
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(e->cases, 2);  // 8 adapters, 3 slices: not this target's
  EXPECT_EQ(e->met, 1);
  EXPECT_NE(r.text.find("time over cuBLAS's 1.040 > 1.030"), std::string::npos) << r.text;
}

TEST(Targets, ByTokens) {
  // the op targets split by token count: ordered by op (as first seen) then tokens, with each row's range
  auto with_t = [](nlohmann::json c, int t, const std::string& id) {
    c["params"] = {{"num_tokens", t}};
    c["id"] = id;
    return c;
  };
  auto d = doc({with_t(op_case("lora_shrink", 20, 0.9, 10, 26), 8192, "a/lora_shrink/t=8192"),
                with_t(op_case("lora_shrink", 20, 0.7, 12, 26), 8192, "b/lora_shrink/t=8192"),
                with_t(op_case("lora_shrink", 12, 0.5, 24, 20), 64, "a/lora_shrink/t=64"),
                with_t(op_case("lora_expand", 20, 0.6, 12, 30), 2048, "a/lora_expand/t=2048")});
  const TargetsReport r = evaluate_targets({d}, {"dense_prefill"}, false, true);
  ASSERT_EQ(r.rows.size(), 3u) << r.text;
  EXPECT_EQ(r.rows[0].group, "lora_shrink T=64");
  EXPECT_EQ(r.rows[1].group, "lora_shrink T=8192");
  EXPECT_EQ(r.rows[2].group, "lora_expand T=2048");
  EXPECT_EQ(r.rows[1].cases, 2);
  EXPECT_EQ(r.rows[1].met, 1);
  EXPECT_DOUBLE_EQ(r.rows[1].lo, 0.7);
  EXPECT_DOUBLE_EQ(r.rows[1].hi, 0.9);
  EXPECT_NE(r.text.find("0.700-0.900"), std::string::npos) << r.text;
  EXPECT_NE(r.text.find("range"), std::string::npos) << r.text;
  EXPECT_DOUBLE_EQ(r.doc["targets"][1]["min"].get<double>(), 0.7);
  // without by_tokens: one row per op, no range column, the same verdicts
  const TargetsReport plain = evaluate_targets({d}, {"dense_prefill"}, false);
  ASSERT_EQ(plain.rows.size(), 2u);
  EXPECT_EQ(plain.rows[0].group, "lora_shrink");
  EXPECT_EQ(plain.rows[0].cases, 3);
  EXPECT_EQ(plain.met, r.met);
  EXPECT_EQ(plain.text.find("range"), std::string::npos) << plain.text;
}

TEST(Targets, LayerCases) {
  auto d = doc({layer_case("prefill", false, 45, nlohmann::json::object(), 0.75),
                // sharded: 70 > 1.1 x (45 + 10) = 60.5; the base layer's all-reduce (100) must not count
                layer_case("prefill", true, 70, {{"comm_all_gather_us", 10.0}, {"comm_all_gather_batch_us", 9.0},
                                                 {"comm_base_all_reduce_us", 100.0}}),
                layer_case("decode", false, 5, nlohmann::json::object()),
                layer_case("decode", true, 6, {{"comm_all_gather_us", 12.0}, {"comm_all_gather_batch_us", 16.0}})});
  const TargetsReport r = evaluate_targets({d}, {}, false);
  ASSERT_NE(find(r, "prefill_floor", "qkv tp=2"), nullptr);
  EXPECT_EQ(find(r, "prefill_floor", "qkv tp=2")->met, 0);
  EXPECT_EQ(find(r, "prefill_floor", "qkv tp=2")->cases, 1);
  EXPECT_EQ(find(r, "fully_sharded", "prefill qkv")->met, 0);
  EXPECT_EQ(find(r, "fully_sharded", "decode qkv")->met, 1);  // 6 <= 1.1 x (5 + 12)
  EXPECT_EQ(find(r, "decode_gather", "qkv")->met, 0);         // 16 > 15
}

TEST(Targets, NothingToEvaluate) {
  auto d = doc({{{"id", "s/lora_meta/x=1"}, {"op", "lora_meta"}, {"status", "pass"}, {"timing", {{"batch_time_us", 1}}}}});
  EXPECT_THROW(evaluate_targets({d}, {}, false), Error);
  EXPECT_THROW(evaluate_targets({nlohmann::json::object()}, {}, false), Error);
}

// A miss by less than the printed precision is printed with the digits that tell value and bound
// apart, never as "0.800 < 0.800".
TEST(Targets, MissesPrintApart) {
  auto d = doc({layer_case("prefill", false, 50.51, nlohmann::json::object(), 0.79996),
                op_case("lora_expand", 20, 0.74996, 12, 27)});
  const TargetsReport r = evaluate_targets({d}, {}, true);
  EXPECT_EQ(find(r, "prefill_floor", "qkv tp=2")->met, 0);
  EXPECT_NE(r.text.find("LoRA floor fraction 0.79996 < 0.80000 (50.510 us; 0.8 needs <= 50.507 us)"), std::string::npos)
      << r.text;
  EXPECT_EQ(find(r, "dense_prefill", "lora_expand")->met, 0);
  EXPECT_NE(r.text.find("s/lora_expand/x=1: copy fraction 0.74996 < 0.75000"), std::string::npos) << r.text;
  EXPECT_EQ(r.text.find("0.800 < 0.800"), std::string::npos) << r.text;
  // the summary's median too: 0.79996, not 0.800
  EXPECT_NE(r.text.find("prefill_floor        qkv tp=2                     0       1   0.79996"), std::string::npos)
      << r.text;
}

// Repeated runs of the same cases (one document each) each count: a row reads "met k of n runs"
// and its median is over the runs.
TEST(Targets, RepeatedRunsEachCount) {
  std::vector<nlohmann::json> runs;
  for (double ff : {0.81, 0.79, 0.78})
    runs.push_back(doc({layer_case("prefill", false, 50, nlohmann::json::object(), ff)}));
  const TargetsReport r = evaluate_targets(runs, {"prefill_floor"}, false);
  const TargetRow* row = find(r, "prefill_floor", "qkv tp=2");
  ASSERT_NE(row, nullptr);
  EXPECT_EQ(row->cases, 3);
  EXPECT_EQ(row->met, 1);
  EXPECT_DOUBLE_EQ(row->median, 0.79);
  EXPECT_EQ(r.doc["sources"].size(), 3u);
}

TEST(Targets, MoeCases) {
  // moe_prefill: copy fraction >= 0.7 where the floor >= 10 us, or the FLOP term's fraction where
  // it exceeds the floor (gemm 100 TFLOP/s: 4e9 FLOPs = 40 us > floor 20 us, over 50 us = 0.8);
  // moe_decode: node 0.5 x kernels + 2 + floor / 0.7 (floor 1.4 -> 4.5 us; w13 aligned 5 us);
  // moe_vs_cublas: speedup_vs_cublas_grouped > 1
  auto moe = [](const std::string& op, double floor_us, double flops, double cold, double batch, double copyf,
                double speedup, const std::string& plan) {
    return nlohmann::json{{"id", "m/" + op + "/f=" + std::to_string(floor_us) + "/p=" + plan}, {"op", op},
                          {"status", "pass"}, {"plan", plan},
                          {"work", {{"floor_us", floor_us}, {"flops", flops}}},
                          {"metrics", {{"copy_fraction", copyf}, {"speedup_vs_cublas_grouped", speedup}}},
                          {"timing", {{"time_us", {{"median", cold}}}, {"batch_time_us", batch}}}};
  };
  auto d = doc({moe("add_lora_w2", 20, 1e6, 25, 25, 0.75, 1.2, "aligned"),            // prefill met (copy)
                moe("add_lora_w2", 20, 4e9, 50, 50, 0.1, 0.9, "aligned"),             // met by the FLOP term
                moe("add_lora_w2", 30, 1e6, 60, 60, 0.5, 2.0, "aligned"),             // prefill missed
                moe("add_lora_w13", 1.4, 1e3, 3, 4.9, 0.3, 1.1, "align+fused"),       // decode met (2 kernels)
                moe("add_lora_w13", 1.4, 1e3, 3, 4.9, 0.3, 1.1, "naive"),             // decode missed (1 kernel)
                moe("moe_lora_align", 1.4, 0, 3, 4.4, 0.3, -1, "aligned"),            // decode met, no cuBLAS row
                moe("add_lora_w13", 1.4, 1e3, 3, 4.9, 0.3, 1.1, "naive"),             // the graph's 3 nodes: met
                moe("add_lora_w13", 1.4, 1e3, 3, 4.9, 0.3, 1.1, "align+fused")});     // its 1 node: missed
  d["run"]["ceilings"]["gemm_bf16_tflops"] = 100.0;
  d["cases"][5]["metrics"].erase("speedup_vs_cublas_grouped");
  // timing.batch_nodes_per_call (the batch graph's own count) replaces the count by plan
  d["cases"][6]["timing"]["batch_nodes_per_call"] = 3.0;
  d["cases"][6]["id"] = "m/add_lora_w13/nodes=3";
  d["cases"][7]["timing"]["batch_nodes_per_call"] = 1.0;
  d["cases"][7]["id"] = "m/add_lora_w13/nodes=1";
  const auto r = evaluate_targets({d}, {}, true);
  const TargetRow* p = find(r, "moe_prefill", "add_lora_w2");
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(p->cases, 3);
  EXPECT_EQ(p->met, 2);
  const TargetRow* w13 = find(r, "moe_decode", "add_lora_w13");
  ASSERT_NE(w13, nullptr);
  EXPECT_EQ(w13->cases, 4);
  EXPECT_EQ(w13->met, 2);
  const TargetRow* al = find(r, "moe_decode", "moe_lora_align");
  ASSERT_NE(al, nullptr);
  EXPECT_EQ(al->met, 1);
  const TargetRow* cb = find(r, "moe_vs_cublas", "add_lora_w2");
  ASSERT_NE(cb, nullptr);
  EXPECT_EQ(cb->cases, 3);
  EXPECT_EQ(cb->met, 2);
  const TargetRow* cb13 = find(r, "moe_vs_cublas", "add_lora_w13");
  ASSERT_NE(cb13, nullptr);
  EXPECT_EQ(cb13->cases, 4);
  EXPECT_EQ(find(r, "moe_vs_cublas", "moe_lora_align"), nullptr);
}

// moe_layer_overhead (issue 46): Mixtral-8x7B T = 4096 tp 1 plain, overhead <= 15 %, counted only
// where the expert GEMMs reach half the GEMM rate; other presets and tp are not counted.
TEST(Targets, MoeLayerOverhead) {
  auto layer = [](const std::string& model, double tp, double overhead, double rate) {
    return nlohmann::json{
        {"id", "prefill_tp/layer/model=" + model + "/tp=" + std::to_string(int(tp)) + "/o=" + std::to_string(overhead)},
        {"op", "layer"},
        {"status", "pass"},
        {"params", {{"layer", "fused_moe"}, {"model", model}, {"num_tokens", 4096}, {"tp", tp},
                    {"fully_sharded", false}, {"ranks", {16}}, {"num_adapters", 4}, {"max_loras", 4}}},
        {"metrics", {{"lora_overhead_pct", overhead}, {"base_gemm_rate_fraction", rate}}},
        {"timing", {{"time_us", {{"median", 100}}}, {"lora_us", 10.0}}}};
  };
  auto d = doc({layer("mixtral-8x7b", 1, 9.5, 0.7), layer("mixtral-8x7b", 1, 16, 0.6), layer("mixtral-8x7b", 1, 40, 0.3),
                layer("qwen3-30b-a3b", 1, 30, 0.6), layer("mixtral-8x7b", 2, 30, 0.6)});
  const TargetsReport r = evaluate_targets({d}, {"moe_layer_overhead"}, true);
  const TargetRow* row = find(r, "moe_layer_overhead", "mixtral-8x7b tp=1");
  ASSERT_NE(row, nullptr);
  EXPECT_EQ(row->cases, 2);
  EXPECT_EQ(row->met, 1);
  EXPECT_NE(r.text.find("LoRA overhead 16.00 % > 15.00 %"), std::string::npos) << r.text;
}
