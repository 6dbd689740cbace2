// Unit tests of the result side: compare_tensor (tolerance, NaN, untouched elements, row filter),
// exporters, compare of two result documents, atomic writes and the .npy writer.
#include <gtest/gtest.h>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include "apps/punica-bench/npy.h"
#include "apps/punica-bench/report.h"
#include "apps/punica-bench/runner.h"
#include "kernels/common/error.h"

using namespace punica;
using namespace punica::bench;

namespace {
HostTensor f32_tensor(std::vector<float> v, bool keep_first = false) {
  HostTensor t;
  t.name = "y";
  t.dtype = kernels::DType::f32;
  t.shape = {int64_t(v.size())};
  t.role = Role::output;
  t.data.resize(v.size() * 4);
  std::memcpy(t.data.data(), v.data(), v.size() * 4);
  t.rows = int64_t(v.size());
  t.inner = 1;
  t.must_keep.assign(v.size(), 0);
  if (keep_first) t.must_keep[0] = 1;
  return t;
}
auto all_rows = [](int64_t) { return true; };

nlohmann::json doc_with(double median, const std::string& status = "pass") {
  return {{"schema", "punica-bench.result/1"},
          {"tool", {{"version", "0.1.0"}, {"git_sha", "abc"}}},
          {"run", {{"started_at", "2026-11-30T00:00:00Z"}}},
          {"devices", {{{"name", "NVIDIA H200"}}}},
          {"cases", {{{"id", "n/lora_shrink/x=1"}, {"op", "lora_shrink"}, {"status", status},
                      {"params", {{"num_tokens", 16}, {"dtype", "bf16"}}},
                      {"check", {{"nwrong", status == "pass" ? 0 : 3}}},
                      {"timing", {{"iters", 10}, {"time_us", {{"median", median}, {"p10", median}, {"p90", median}}}}},
                      {"metrics", {{"gb_per_s", 100.0}, {"tokens_per_s", 1e6}, {"floor_fraction", 0.5}}}}}},
          {"summary", {{"cases", 1}}}};
}
}  // namespace

TEST(CompareTensor, WithinTolerancePasses) {
  auto t = f32_tensor({1, 2, 3, 4});
  std::vector<float> a = {1.00001f, 2, 3, 4}, e = {1, 2, 3, 4};
  auto r = compare_tensor(t, a.data(), e.data(), 1e-4, all_rows);
  EXPECT_EQ(r.nwrong, 0u);
  EXPECT_EQ(r.nelems, 4u);
}
TEST(CompareTensor, OutsideToleranceAndNaNFail) {
  auto t = f32_tensor({1, 2, 3, 4});
  std::vector<float> a = {1.5f, 2, std::nanf(""), 4}, e = {1, 2, 3, 4};
  auto r = compare_tensor(t, a.data(), e.data(), 1e-2, all_rows);
  EXPECT_EQ(r.nwrong, 2u);
  EXPECT_FALSE(r.first_mismatches.empty());
}
TEST(CompareTensor, UntouchedMustBeBitEqualToInitial) {
  auto t = f32_tensor({7, 2}, /*keep_first=*/true);
  std::vector<float> e = {7, 2};
  std::vector<float> a = {7.0000005f, 2};  // within any tolerance, but not bit-equal
  auto r = compare_tensor(t, a.data(), e.data(), 1e-2, all_rows);
  EXPECT_EQ(r.nwrong, 1u);
  EXPECT_FALSE(r.untouched_ok);
}
TEST(CompareTensor, RowFilterSkipsRows) {
  auto t = f32_tensor({1, 2, 3, 4});
  std::vector<float> a = {9, 2, 3, 4}, e = {1, 2, 3, 4};
  auto r = compare_tensor(t, a.data(), e.data(), 1e-2, [](int64_t row) { return row != 0; });
  EXPECT_EQ(r.nwrong, 0u);
  EXPECT_EQ(r.nelems, 3u);
}
// An accumulating bf16 output at a rounding tie of the delta (NOTES v14's vLLM-grid case): y0 =
// -0.98046875 plus the bf16 rounding of the dot 1.05078125 (exactly the midpoint of 1.046875 and
// 1.0546875) is 0.06640625 or 0.07421875, one unit of the delta apart: both pass, two units do not,
// and a write-only output (NaN initial values) gets no such slack.
TEST(CompareTensor, AccumulatingOutputsAllowOneUlpOfTheDelta) {
  EXPECT_EQ(ulp_of(kernels::DType::bf16, 1.05078125), 0.0078125);
  EXPECT_EQ(ulp_of(kernels::DType::f16, 1.5), std::ldexp(1.0, -10));
  EXPECT_EQ(ulp_of(kernels::DType::bf16, 0.0), 0.0);
  auto bf16_tensor = [](float init) {
    HostTensor t;
    t.name = "y";
    t.dtype = kernels::DType::bf16;
    t.shape = {1};
    t.role = Role::output;
    t.data.resize(2);
    kernels::store_elem(t.data.data(), t.dtype, 0, init);
    t.rows = 1;
    t.must_keep.assign(1, 0);
    return t;
  };
  auto bits = [](float v) {
    std::vector<uint8_t> b(2);
    kernels::store_elem(b.data(), kernels::DType::bf16, 0, v);
    return b;
  };
  const auto t = bf16_tensor(-0.98046875f);
  const auto want = bits(0.06640625f), flip = bits(0.07421875f), two = bits(0.08203125f);
  EXPECT_EQ(compare_tensor(t, flip.data(), want.data(), 1e-2, all_rows).nwrong, 0u);
  EXPECT_EQ(compare_tensor(t, want.data(), flip.data(), 1e-2, all_rows).nwrong, 0u);
  EXPECT_EQ(compare_tensor(t, two.data(), want.data(), 1e-2, all_rows).nwrong, 1u);
  const auto poisoned = bf16_tensor(std::nanf(""));
  EXPECT_EQ(compare_tensor(poisoned, flip.data(), want.data(), 1e-2, all_rows).nwrong, 1u);
}
TEST(CompareTensor, IntTensorsExact) {
  HostTensor t;
  t.name = "ids";
  t.is_int = true;
  t.shape = {3};
  t.role = Role::output;
  std::vector<int32_t> a = {1, 2, 3}, e = {1, 2, 4};
  EXPECT_EQ(compare_tensor(t, a.data(), e.data(), 0, all_rows).nwrong, 1u);
}

TEST(Exporters, GbenchHasTheFieldsDashboardsRead) {
  auto j = nlohmann::json::parse(export_gbench(doc_with(12.5)));
  ASSERT_EQ(j["benchmarks"].size(), 1u);
  auto& b = j["benchmarks"][0];
  EXPECT_EQ(b["name"], "n/lora_shrink/x=1");
  EXPECT_EQ(b["time_unit"], "us");
  EXPECT_DOUBLE_EQ(b["real_time"].get<double>(), 12.5);
  EXPECT_EQ(b["run_type"], "iteration");
  EXPECT_TRUE(j.contains("context"));
  auto f = nlohmann::json::parse(export_gbench(doc_with(12.5, "fail")));
  EXPECT_TRUE(f["benchmarks"][0]["error_occurred"].get<bool>());
}
TEST(Exporters, CsvAndMarkdown) {
  std::string csv = export_csv(doc_with(3));
  EXPECT_EQ(csv.rfind("id,op,status,", 0), 0u);
  EXPECT_NE(csv.find("n/lora_shrink/x=1,lora_shrink,pass"), std::string::npos);
  // the copy baseline's columns come last, empty where a result has none
  EXPECT_NE(csv.find(",skip_reason,copy_us,copy_batch_us,copy_fraction,copy_batch_fraction\n"), std::string::npos);
  EXPECT_NE(csv.find(",,,,\n"), std::string::npos) << csv;
  auto d = doc_with(3);
  d["cases"][0]["baseline"] = {{"copy_us", 2.5}, {"copy_batch_us", 2}};
  d["cases"][0]["metrics"]["copy_fraction"] = 0.75;
  d["cases"][0]["metrics"]["copy_batch_fraction"] = 0.5;
  EXPECT_NE(export_csv(d).find(",2.5,2,0.75,0.5\n"), std::string::npos) << export_csv(d);
  EXPECT_DOUBLE_EQ(nlohmann::json::parse(export_gbench(d))["benchmarks"][0]["copy_fraction"].get<double>(), 0.75);
  std::string md = export_md(doc_with(3));
  EXPECT_NE(md.find("| `n/lora_shrink/x=1` | pass |"), std::string::npos);
}
TEST(Exporters, BencherAndGithubActionBenchmark) {
  auto bmf = nlohmann::json::parse(export_bmf(doc_with(12.5)));
  EXPECT_DOUBLE_EQ(bmf["n/lora_shrink/x=1"]["latency"]["value"].get<double>(), 12500.0);
  EXPECT_TRUE(nlohmann::json::parse(export_bmf(doc_with(12.5, "fail"))).empty());
  auto gt = nlohmann::json::parse(export_gha(doc_with(12.5), true));
  ASSERT_EQ(gt.size(), 1u);
  EXPECT_EQ(gt[0]["unit"], "us");
  EXPECT_DOUBLE_EQ(gt[0]["value"].get<double>(), 12.5);
  auto gb = nlohmann::json::parse(export_gha(doc_with(12.5), false));
  EXPECT_EQ(gb[0]["unit"], "GB/s");
  EXPECT_TRUE(nlohmann::json::parse(export_gha(doc_with(1, "fail"), true)).empty());
}
TEST(ResultFile, AtomicWriteRefusesExistingAndLoadValidates) {
  namespace fs = std::filesystem;
  std::string p = (fs::temp_directory_path() / ("pb_report_test_" + std::to_string(::getpid()) + ".json")).string();
  fs::remove(p);
  write_json_atomic(p, doc_with(1), false);
  EXPECT_THROW(write_json_atomic(p, doc_with(1), false), Error);
  write_json_atomic(p, doc_with(2), true);
  EXPECT_DOUBLE_EQ(load_result(p)["cases"][0]["timing"]["time_us"]["median"].get<double>(), 2.0);
  { std::ofstream(p) << "{\"schema\": \"other\"}"; }
  try {
    load_result(p);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.exit_code(), 2);
    EXPECT_NE(std::string(e.what()).find("/schema"), std::string::npos);
  }
  // a gzipped file (results/history's form) is named as such, with the way to read it
  { std::ofstream(p, std::ios::binary) << std::string("\x1f\x8b\x08\x00", 4) << "rest"; }
  try {
    load_result(p);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.exit_code(), 2);
    EXPECT_NE(std::string(e.what()).find("gzip-compressed"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("gunzip -c"), std::string::npos) << e.what();
  }
  fs::remove(p);
}
TEST(Npy, HeaderIsNumpyFormat1) {
  namespace fs = std::filesystem;
  std::string p = (fs::temp_directory_path() / ("pb_npy_" + std::to_string(::getpid()) + ".npy")).string();
  std::vector<float> v = {1, 2, 3, 4, 5, 6};
  write_npy(p, "<f4", {2, 3}, v.data(), v.size() * 4);
  std::ifstream f(p, std::ios::binary);
  std::string s((std::istreambuf_iterator<char>(f)), {});
  ASSERT_GT(s.size(), 10u);
  EXPECT_EQ(s.substr(0, 6), "\x93NUMPY");
  uint16_t hl = uint16_t(uint8_t(s[8]) | (uint8_t(s[9]) << 8));
  EXPECT_EQ((10 + hl) % 64, 0u);
  std::string header = s.substr(10, hl);
  EXPECT_NE(header.find("'shape': (2, 3)"), std::string::npos);
  EXPECT_NE(header.find("'descr': '<f4'"), std::string::npos);
  EXPECT_EQ(s.size(), 10u + hl + 24u);
  fs::remove(p);
}

// The baseline block carries both ways the grouped GEMMs are timed, and the speedup uses the
// faster one (cublas_grouped_us, which the runner sets to the smaller of the two).
TEST(CaseRecord, GroupedBaselineBothWaysAndTheFaster) {
  Case c;
  c.id = "n/add_lora_w13/x=1";
  c.name = "n";
  c.op = "add_lora_w13";
  CaseResult r;
  r.c = &c;
  r.status = "pass";
  TimingResult t;
  t.time.median = 10;
  r.timing = t;
  BaselineResult b;
  b.cublas_grouped_batched_us = 30;
  b.cublas_gemm_graph_us = 20;
  b.cublas_grouped_us = 20;
  r.baseline = b;
  const nlohmann::json j = case_record(r);
  EXPECT_DOUBLE_EQ(j["baseline"]["cublas_grouped_batched_us"].get<double>(), 30);
  EXPECT_DOUBLE_EQ(j["baseline"]["cublas_gemm_graph_us"].get<double>(), 20);
  EXPECT_DOUBLE_EQ(j["metrics"]["speedup_vs_cublas_grouped"].get<double>(), 2);
  EXPECT_TRUE(j["baseline"]["cublas_us"].is_null());
  b.cublas_gemm_graph_us = -1;  // unavailable: null, not -1
  r.baseline = b;
  EXPECT_TRUE(case_record(r)["baseline"]["cublas_gemm_graph_us"].is_null());
}
