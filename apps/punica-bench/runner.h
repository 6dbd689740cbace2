// The case loop (DESIGN §6-§7): for each case, check against the reference on fresh poisoned
// buffers with guards, then time it cold (inputs rotated past 2x L2) and back to back (one CUDA
// graph of >= 16 calls), with the floor, the cuBLAS baselines and rank agreement after every case.
#pragma once
#include <functional>
#include <map>
#include <optional>
#include <memory>
#include <string>
#include <vector>
#include <nlohmann/json.hpp>
#include "apps/punica-bench/backend/backend.h"
#include "apps/punica-bench/problem.h"
#include "apps/punica-bench/case_result.h"
#include "apps/punica-bench/scenario.h"

namespace punica::bench {

class Dist;

struct RunOptions {
  bool timing = true;           // run: true, check: false
  int iters = -1, warmup = -1;  // -1 = the case's value
  int batch_calls = 16;
  int64_t sample_rows = 0;      // check only this many rows per case on the CPU (0 = all)
  bool nan_padding = false;
  bool exact = false;
  bool baselines = true;
  double timeout_s = 0;         // per case; 0 = none
  std::string dump_dir;         // write .npy files of failing cases (or all with dump_all)
  bool dump_all = false;
  int verbose = 0;              // -q = -1
  std::string inject_fault;     // test-only "RANK:throw|hang"
  std::string repro_prefix;     // command line prefix for --print-repro
  bool print_repro = false;
};

class Runner {
 public:
  Runner(Backend& be, Dist* dist, RunOptions opt);
  // Measures the run's ceilings (rank 0's view, max/min agreed over ranks).
  Ceilings measure_ceilings();
  CaseResult run_case(const Case& c, int index, int total);
  const Ceilings& ceilings() const { return ceil_; }

 private:
  CaseResult run_case_impl(const Case& c);
  Backend& be_;
  Dist* dist_;
  RunOptions opt_;
  Ceilings ceil_;
};

// Result of comparing one output tensor.
struct CompareResult {
  std::size_t nelems = 0, nwrong = 0;
  double max_abs_err = 0, max_rel_err = 0, atol = 0, rtol = 0;
  bool untouched_ok = true;
  std::vector<std::string> first_mismatches;
};
// One unit in the last place of |v| in dtype t (0 for 0 or non-finite v).
double ulp_of(kernels::DType t, double v);
// |y - r| <= atol + rtol |r|, atol = rtol * rms(r over compared elements) (DESIGN §6), plus, for
// accumulating outputs (finite initial y0), one ulp of |r - y0| in the output dtype (a rounding tie
// of the op's delta); must_keep elements must be bit-equal to `initial`; int tensors exactly equal.
// row_filter(row) false = not compared.
CompareResult compare_tensor(const HostTensor& t, const void* actual, const void* expected,
                             double rtol, const std::function<bool(int64_t)>& row_filter);

}  // namespace punica::bench
