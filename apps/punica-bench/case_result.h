// What one case gave, as the runner measured it: status, check summary, work and floor, cold and
// back-to-back timing, baselines and collectives. The runner fills it; report.cpp alone turns it
// into the result JSON (case_record) and the table.
#pragma once
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>
#include "apps/punica-bench/scenario.h"

namespace punica::bench {

// Order statistics of timings (or any sample): median, p10 / p90 (nearest rank), min, max, mean,
// population stdev. All zero for an empty sample.
struct Stats { double median = 0, p10 = 0, p90 = 0, min = 0, max = 0, mean = 0, stdev = 0; };
Stats stats(std::vector<double> v);

// What one case gave, as measured (report.cpp's case_record() makes the result JSON of it).
struct CheckSummary {
  std::string mode;        // tolerance | exact
  std::string reference;   // naive_fp64 (cpu backend) | eigen (cuda backend)
  double rtol = 0, atol = 0, max_abs_err = 0, max_rel_err = 0;
  std::size_t nelems = 0, nwrong = 0;
  bool guard_ok = true, untouched_ok = true;
  int64_t sampled_rows = 0;  // --sample-rows (0 = every row)
  std::vector<std::string> first_mismatches;
};
struct TimingResult {
  std::string method, batch_mode;
  std::size_t rotated_copies = 1;
  int warmup = 0, iters = 0, batch_calls = 0;
  Stats time;                 // cold, per iteration, max over ranks
  double batch_us = -1;       // back to back (negative = unsupported)
  double batch_nodes = -1;    // graph nodes per call of the back-to-back batch (negative = no graph)
  bool launches_held = false;
  std::vector<std::pair<std::string, double>> part_us;  // layer parts (base, lora, comm_*), in order
  std::map<std::string, double> part_batch_us;          // the collectives back to back
};
struct BaselineResult {  // negative = unavailable
  double cublas_us = -1, cublas_grouped_us = -1, copy_us = -1, copy_batch_us = -1;
  // cublas_grouped_us = the faster of one grouped-batched call per Grouped entry and per-group GEMMs
  // in one CUDA graph
  double cublas_grouped_batched_us = -1, cublas_gemm_graph_us = -1;
  bool launches_held = false;
};
struct CommResult {
  std::string op;
  double bytes = 0;
  int tp = 1;
  double time_us = -1, graph_time_us = -1;
};
struct CaseResult {
  const Case* c = nullptr;
  std::string status;        // pass | fail | skip | error
  std::string skip_reason, error, plan, repro;
  std::optional<CheckSummary> check;
  struct Work {
    double bytes = 0, flops = 0;
    int64_t tokens = 0;
  };
  std::optional<Work> work;
  double floor_us = 0;
  // Layers with base GEMMs (fused_moe): their FLOPs over timing.base_gemms_us, and that rate over
  // run.ceilings.gemm_bf16_tflops (-1 = not measured).
  double base_gemm_tflops = -1, base_gemm_rate_fraction = -1;
  std::optional<TimingResult> timing;
  std::optional<BaselineResult> baseline;
  std::vector<CommResult> comm;
};

}  // namespace punica::bench
