// Unit tests of the stdout table (issue 43 item 8): short ids, 160 columns on the committed H200
// results (ops, layers, a check), skip reasons in the rows, no timing columns for a check.
#include <gtest/gtest.h>
#include <fstream>
#include <set>
#include <sstream>
#include "apps/punica-bench/report.h"
#include "apps/punica-bench/table.h"

using namespace punica::bench;

namespace {
std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string l; std::getline(in, l);) out.push_back(l);
  return out;
}
// Display columns of UTF-8 text (continuation bytes take none).
std::size_t columns(const std::string& s) {
  std::size_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;
  return n;
}
}  // namespace

TEST(ShortCaseIds, NameAndTheAxesThatVaryWithinIt) {
  const std::vector<std::string> ids = {
      "a/lora_shrink/hidden=64/tp=1/seed=0", "a/lora_shrink/hidden=64/tp=2/seed=0", "a/lora_expand/hidden=64/tp=1/seed=0",
      "b/layer/model=x/tp=1", "c/lora_shrink/k=v/with/slash/tp=1", "c/lora_shrink/k=w/tp=1", "noslash"};
  const auto s = short_case_ids(ids);
  ASSERT_EQ(s.size(), ids.size());
  EXPECT_EQ(s[0], "a/tp=1");
  EXPECT_EQ(s[1], "a/tp=2");
  EXPECT_EQ(s[2], "a/tp=1");  // the op column tells it from s[0]
  EXPECT_EQ(s[3], "b");
  EXPECT_EQ(s[4], "c/k=v/with/slash");
  EXPECT_EQ(s[5], "c/k=w");
  EXPECT_EQ(s[6], "noslash");
}

TEST(ResultsTable, CommittedResultsFit160ColumnsWithUniqueRows) {
  for (const char* f : {"results/h200/bench_lora_ops.json", "results/h200/bench_llama3_8b.json",
                        "results/h200/check_smoke.json", "results/h200x2/layers_ci_np2.json",
                        "results/h200x2/layers_llama_prefill_np2.json"}) {
    const auto doc = load_result(std::string(PUNICA_SOURCE_DIR) + "/" + f);
    const std::string text = format_results_table(doc, false);
    std::set<std::string> rows;
    std::size_t n = 0, id_at = 0;
    for (const auto& l : lines_of(text)) {
      EXPECT_LE(columns(l), 160u) << f << ": " << l;
      if (l.rfind("status", 0) == 0) id_at = l.rfind("  id") + 2;
      if (l.empty() || l[0] == '#' || l.rfind("status", 0) == 0) continue;
      ++n;
      // a row is told apart by its op and short id (before any "  (skip: ...)"); clipped ones end in "..."
      const std::string op = l.substr(7, l.find(' ', 7) - 7);
      const std::string id = l.substr(id_at, l.find("  (", id_at) - id_at);
      if (id.size() < 3 || id.compare(id.size() - 3, 3, "...") != 0) {
        EXPECT_TRUE(rows.insert(op + " " + id).second) << f << ": " << l;
      }
    }
    EXPECT_EQ(n, doc["cases"].size()) << f;
    // -v: the full ids, unclipped
    const std::string full = format_results_table(doc, true);
    for (const auto& c : doc["cases"]) EXPECT_NE(full.find(c["id"].get<std::string>()), std::string::npos);
  }
}

TEST(ResultsTable, SkipReasonsInTheRowsAndNoTimingColumnsForACheck) {
  nlohmann::json doc = {{"tool", {{"version", "0.1.0"}, {"git_sha", "abc"}}},
                        {"run", {{"backend", "cpu"}, {"world_size", 1}, {"mpi", "x"}, {"options", {{"timing", false}}}}},
                        {"devices", nlohmann::json::array()},
                        {"cases",
                         {{{"id", "n/layer/tp=1"}, {"op", "layer"}, {"status", "pass"}, {"check", {{"nwrong", 0}}}},
                          {{"id", "n/layer/tp=4"}, {"op", "layer"}, {"status", "skip"},
                           {"skip_reason", "tp=4 needs 4 ranks (processes), 1 launched"}}}},
                        {"summary", {{"cases", 2}, {"pass", 1}, {"skip", 1}}}};
  const std::string text = format_results_table(doc, false);
  EXPECT_EQ(text.find("time_us"), std::string::npos) << text;
  EXPECT_EQ(text.find("ceilings"), std::string::npos) << text;
  EXPECT_NE(text.find("n/tp=4  (skip: tp=4 needs 4 ranks (processes), 1 launched)"), std::string::npos) << text;
  EXPECT_NE(text.find("# skip (1 case): tp=4 needs 4 ranks"), std::string::npos) << text;
  EXPECT_NE(text.find("# cases 2: pass 1, fail 0, skip 1, error 0; exit code 0"), std::string::npos) << text;
  doc["run"]["options"]["timing"] = true;
  EXPECT_NE(format_results_table(doc, false).find("time_us"), std::string::npos);
}
