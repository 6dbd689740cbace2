// Results (DESIGN §5): the punica-bench.result/1 document, its atomic write, the stdout table,
// the exporters (Google Benchmark JSON, CSV, Markdown) and `compare` of two result files.
#pragma once
#include <initializer_list>
#include <string>
#include <vector>
#include <nlohmann/json.hpp>

namespace punica::bench {

nlohmann::json tool_info();  // version, git sha + dirty, CUDA/NCCL/MPI versions, compiler
// The member at `path` in nested objects, or a null value when one is missing.
const nlohmann::json& json_at(const nlohmann::json& j, std::initializer_list<const char*> path);
// Order statistics of timings (or any sample): median, p10 / p90 (nearest rank), min, max, mean,
// population stdev. All zero for an empty sample.
struct Stats { double median = 0, p10 = 0, p90 = 0, min = 0, max = 0, mean = 0, stdev = 0; };
Stats stats(std::vector<double> v);
// Writes `doc` to `path` atomically (temp file + rename). "-" = stdout. Refuses to replace an
// existing file unless overwrite (Error usage).
void write_json_atomic(const std::string& path, const nlohmann::json& doc, bool overwrite);
// Loads a result document; Error(usage) naming the file for anything that is not one.
nlohmann::json load_result(const std::string& path);
// The human table (stdout): '#' header lines, one row per case, totals.
std::string format_table(const nlohmann::json& doc);
std::string export_gbench(const nlohmann::json& doc);
std::string export_csv(const nlohmann::json& doc);
std::string export_md(const nlohmann::json& doc);
// Bencher Metric Format: {id: {latency: {value, lower_value, upper_value} (ns), throughput: {value}}}.
std::string export_bmf(const nlohmann::json& doc);
// github-action-benchmark customSmallerIsBetter (time, µs) / customBiggerIsBetter (GB/s) arrays;
// failed and skipped cases are omitted (the action charts values blindly).
std::string export_gha(const nlohmann::json& doc, bool time);

struct CompareReport {
  std::string text;
  int regressions = 0, improvements = 0, matched = 0;
  bool kernels_differ = false;  // run.options.kernels differ (a file without them counts as automatic)
};
// Cases matched by id; a regression = B's median time more than threshold_pct slower than A's,
// or a case that passed in A and fails in B.
CompareReport compare_results(const nlohmann::json& a, const nlohmann::json& b, double threshold_pct);

}  // namespace punica::bench
