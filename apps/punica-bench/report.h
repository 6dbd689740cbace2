// Results (DESIGN §5): the punica-bench.result/1 document, its atomic write, the stdout table,
// the exporters (Google Benchmark JSON, CSV, Markdown) and `compare` of two result files.
#pragma once
#include <initializer_list>
#include <optional>
#include <string>
#include <vector>
#include <nlohmann/json.hpp>
#include "apps/punica-bench/backend/backend.h"
#include "apps/punica-bench/case_result.h"

namespace punica::bench {

nlohmann::json tool_info();  // version, git sha + dirty, CUDA/NCCL/MPI versions, compiler
// The member at `path` in nested objects, or a null value when one is missing.
const nlohmann::json& json_at(const nlohmann::json& j, std::initializer_list<const char*> path);
// The result document (schema punica-bench.result/1) before its cases: tool, run, devices.
struct RunHeader {
  std::string started_at, backend, launcher, mpi;
  std::vector<std::string> argv;
  int world_size = 1;
  nlohmann::json options;  // run.options: the command line's options as they were given
  std::vector<std::pair<std::string, std::string>> scenarios;  // (path, name)
  std::vector<nlohmann::json> devices;                         // one per rank
};
nlohmann::json result_document(const RunHeader& h);
// run.ceilings: the measured ceilings, or nulls for a run without timing.
nlohmann::json ceilings_record(const std::optional<Ceilings>& c);
// Sets run.finished_at and the summary (case counts and the exit code).
void finish_result_document(nlohmann::json& doc, const std::string& finished_at, std::size_t cases, int pass,
                            int fail, int skip, int error, int exit_code);
// One case's record of the result document (DESIGN §5): ids and params, status, check, work and
// floor, timing, baselines, the metrics derived from them, collectives, the kernel plan.
nlohmann::json case_record(const CaseResult& r);
// Writes `doc` to `path` atomically (temp file + rename). "-" = stdout. Refuses to replace an
// existing file unless overwrite (Error usage).
void write_json_atomic(const std::string& path, const nlohmann::json& doc, bool overwrite);
// Loads a result document; Error(usage) naming the file for anything that is not one.
nlohmann::json load_result(const std::string& path);
std::string export_gbench(const nlohmann::json& doc);
std::string export_csv(const nlohmann::json& doc);
std::string export_md(const nlohmann::json& doc);
// Bencher Metric Format: {id: {latency: {value, lower_value, upper_value} (ns), throughput: {value}}}.
std::string export_bmf(const nlohmann::json& doc);
// github-action-benchmark customSmallerIsBetter (time, µs) / customBiggerIsBetter (GB/s) arrays;
// failed and skipped cases are omitted (the action charts values blindly).
std::string export_gha(const nlohmann::json& doc, bool time);


}  // namespace punica::bench
