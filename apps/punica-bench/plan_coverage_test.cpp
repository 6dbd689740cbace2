// Issue 43 item 10: every kernel plan the automatic choice can return on an H200 is reached by the
// scenarios the GPU's quick check runs (smoke.json and ci_kernel_grid.json), so a bug planted in any
// one path fails a shipped check. The universe is what the choice returns over a sweep of shapes
// (token counts, hidden sizes, ranks, slices, adapters, dtypes, hints, odd sizes); a plan's kind is
// its name with the numbers dropped ("fused/bm64/ngw2/sk264" -> "fused/bm/ngw/sk"), so the split
// modes (stream-K, split-K, atomics, memset) count apart. Runs on the CPU with an H200's traits.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>
#include <vector>
#include <string>

#include "apps/punica-bench/problem.h"
#include "apps/punica-bench/scenario.h"
#include "kernels/add_lora_linear/add_lora_linear.h"
#include "kernels/lora_expand/lora_expand.h"
#include "kernels/lora_shrink/lora_shrink.h"

namespace punica::bench {
namespace {

std::string kind_of(const std::string& plan) {
  std::string k;
  for (char ch : plan)
    if (!(ch >= '0' && ch <= '9')) k += ch;
  return k;
}
// add_lora_linear's chains pair a shrink with an expand: each half's kind counts, per chain.
std::vector<std::string> linear_kinds(const std::string& plan) {
  const std::string k = kind_of(plan);
  const auto colon = k.find(':'), plus = k.find('+');
  if (colon == std::string::npos || plus == std::string::npos) return {k};
  return {k.substr(0, plus), k.substr(0, colon + 1) + "+" + k.substr(plus + 1)};
}
// A shape that reaches each kind first (printed for the kinds a scenario misses).
std::map<std::string, std::string> g_example;

struct H200 {
  kernels::PlanningDevice d;
  H200() { kernels::set_planning_device_override(&d); }
  ~H200() { kernels::set_planning_device_override(nullptr); }
};

// Aligned, never dereferenced: the plan reads only shapes, strides and pointer alignment.
void* fake(int i) { return reinterpret_cast<void*>(uintptr_t(0x100000) * uintptr_t(i + 1)); }

std::map<std::string, std::set<std::string>> swept_kinds() {
  using kernels::DType;
  std::map<std::string, std::set<std::string>> u;
  const int64_t Ts[] = {1, 3, 8, 16, 24, 32, 48, 64, 96, 128, 129, 200, 256, 384, 512, 768, 1024, 1536, 2048, 3000, 4096, 8192};
  const int64_t Ks[] = {1000, 2048, 4096, 8192};
  const int Rs[] = {8, 16, 32, 64, 128};
  const int Ls[] = {1, 2, 4, 8, 16, 32, 64};
  for (DType dt : {DType::bf16, DType::f32})
    for (int64_t T : Ts)
      for (int64_t K : Ks)
        for (int R : Rs)
          for (int S : {1, 2, 3})
            for (int L : Ls)
              for (int hint : {0, 1}) {
                kernels::LoraShrinkArgs s;
                s.dtype = dt; s.out_dtype = DType::f32; s.num_tokens = T; s.hidden = K; s.x = fake(0);
                s.x_row_stride = K; s.num_slices = S; s.max_loras = L; s.max_rank = R;
                s.num_active_loras = hint ? std::max(1, L / 4) : 0; s.y = fake(1);
                for (int i = 0; i < S; ++i) s.lora_a[i] = fake(2 + i);
                const std::string shape = "T=" + std::to_string(T) + " K=" + std::to_string(K) + " r=" +
                                          std::to_string(R) + " S=" + std::to_string(S) + " L=" + std::to_string(L) +
                                          " hint=" + std::to_string(hint) + (dt == DType::f32 ? " fp32" : " bf16");
                auto note = [&](const std::string& op, const std::string& k) {
                  u[op].insert(k);
                  g_example.emplace(op + " " + k, shape);
                };
                note("lora_shrink", kind_of(kernels::describe_lora_shrink_plan(s)));
                kernels::LoraExpandArgs e;
                e.in_dtype = DType::f32; e.dtype = dt == DType::f32 ? DType::bf16 : dt; e.num_tokens = T;
                e.x = fake(0); e.num_slices = S; e.max_loras = L; e.max_rank = R; e.num_active_loras = s.num_active_loras;
                for (int i = 0; i < S; ++i) { e.lora_b[i] = fake(2 + i); e.slice_width[i] = K; }
                e.y = fake(1); e.y_row_stride = K * S; e.add_inputs = true;
                note("lora_expand", kind_of(kernels::describe_lora_expand_plan(e)));
                if (dt == DType::f32) continue;  // add_lora_linear is 16-bit only
                kernels::AddLoraLinearArgs a;
                a.dtype = dt; a.num_tokens = T; a.hidden = K; a.x = fake(0); a.x_row_stride = K; a.num_slices = S;
                for (int i = 0; i < S; ++i) { a.lora_a[i] = fake(2 + i); a.lora_b[i] = fake(10 + i); a.slice_width[i] = K; }
                a.max_loras = L; a.max_rank = R; a.num_active_loras = s.num_active_loras; a.y = fake(1);
                a.y_row_stride = K * S; a.add_inputs = true; a.workspace = fake(20);
                for (const auto& k : linear_kinds(kernels::describe_add_lora_linear_plan(a))) note("add_lora_linear", k);
              }
  return u;
}

std::map<std::string, std::set<std::string>> scenario_kinds() {
  std::map<std::string, std::set<std::string>> got;
  for (const char* f : {"/scenarios/smoke.json", "/scenarios/ci_kernel_grid.json", "/scenarios/ci_plan_reach.json"}) {
    Scenario sc = load_scenario(std::string(PUNICA_SOURCE_DIR) + f);
    for (const Case& c : sc.cases) {
      if (!c.skip_reason.empty() || (c.op != "lora_shrink" && c.op != "lora_expand" && c.op != "add_lora_linear"))
        continue;
      const std::string plan = make_problem(c)->plan(KernelChoice{});
      if (c.op == "add_lora_linear")
        for (const auto& k : linear_kinds(plan)) got[c.op].insert(k);
      else
        got[c.op].insert(kind_of(plan));
    }
  }
  return got;
}

TEST(PlanCoverage, QuickCheckScenariosReachEveryAutomaticPlan) {
  H200 h200;
  const auto universe = swept_kinds();
  const auto reached = scenario_kinds();
  // The H200's traits took effect: the sweep reaches the tiles that need wgmma and clusters (without
  // them the universe would shrink to what a CPU host plans, and the coverage check would say less).
  const auto& shrink = universe.at("lora_shrink");
  EXPECT_TRUE(std::any_of(shrink.begin(), shrink.end(), [](const std::string& k) { return k.rfind("wgmma", 0) == 0; }));
  EXPECT_TRUE(std::any_of(shrink.begin(), shrink.end(), [](const std::string& k) { return k.rfind("cluster", 0) == 0; }));
  for (const auto& [op, kinds] : universe) {
    ASSERT_FALSE(kinds.empty()) << op;
    std::string missing;
    for (const auto& k : kinds)
      if (k != "none" && (!reached.count(op) || !reached.at(op).count(k)))
        missing += "\n  " + k + "  (e.g. " + g_example[op + " " + k] + ")";
    EXPECT_TRUE(missing.empty()) << op << ": plans the automatic choice returns that smoke.json and "
                                 << "ci_kernel_grid.json never reach:" << missing;
  }
}

TEST(PlanCoverage, KindsDropNumbersOnly) {
  EXPECT_EQ(kind_of("fused/bm64/ngw2/sk264"), "fused/bm/ngw/sk");
  EXPECT_EQ(kind_of("tiles:fused_wk/bm64/sk264+pipe/bm64/bn128/bk16"), "tiles:fused_wk/bm/sk+pipe/bm/bn/bk");
}

}  // namespace
}  // namespace punica::bench
