// punica-microbench: Google Benchmark over the same op registry as punica-bench, single GPU.
// One benchmark per scenario case; each iteration is timed with CUDA events (UseManualTime) over
// input copies rotated past 2x L2; bytes/s and tokens/s counters; JSON output
// (--benchmark_format=json) is what github-action-benchmark's googlecpp reader takes.
//   punica-microbench [--scenario=FILE] [--case-filter=REGEX] [google benchmark flags]
#include <benchmark/benchmark.h>
#include <cstdio>
#include <cstring>
#include <memory>
#include <regex>
#include <string>
#include <vector>
#include "apps/punica-bench/backend/backend.h"
#include "apps/punica-bench/problem.h"
#include "apps/punica-bench/report.h"
#include "apps/punica-bench/scenario.h"
#include "kernels/common/error.h"

using namespace punica;
using namespace punica::bench;

namespace {

struct Prepared {
  std::unique_ptr<Problem> problem;
  std::vector<std::vector<Buffer>> bufs;
  std::vector<std::vector<void*>> ptrs;
};

Prepared prepare(Backend& be, const Case& c) {
  Prepared p;
  p.problem = make_problem(c);
  std::size_t set = 0;
  for (auto& t : p.problem->tensors) set += t.bytes();
  std::size_t copies = std::max<std::size_t>(1, std::min<std::size_t>(64, (2 * be.l2_bytes() + set - 1) / std::max<std::size_t>(set, 1)));
  for (std::size_t i = 0; i < copies; ++i) {
    p.bufs.emplace_back();
    p.ptrs.emplace_back();
    for (auto& t : p.problem->tensors) {
      p.bufs.back().emplace_back(be, t.bytes());
      void* d = p.bufs.back().back().get();
      if (t.role == Role::scratch) be.zero(d, t.bytes());
      else be.upload(d, t.data.data(), t.bytes());
      p.ptrs.back().push_back(d);
    }
    p.problem->prepare(be, p.ptrs.back());
  }
  be.synchronize();
  return p;
}

// The prepared inputs of the case being timed (see the benchmark body); freed before the backend.
const Case* g_held_case = nullptr;
std::unique_ptr<Prepared> g_held;

}  // namespace

int main(int argc, char** argv) {
  std::string scenario = "scenarios/bench_lora_ops.json", filter;
  std::vector<char*> rest;
  for (int i = 0; i < argc; ++i) {
    if (std::strncmp(argv[i], "--scenario=", 11) == 0) scenario = argv[i] + 11;
    else if (std::strncmp(argv[i], "--case-filter=", 14) == 0) filter = argv[i] + 14;
    else rest.push_back(argv[i]);
  }
  int rargc = int(rest.size());
  benchmark::Initialize(&rargc, rest.data());
  {  // provenance in the JSON's context, as punica-bench records it in `tool`
    const nlohmann::json t = tool_info();
    for (const char* k : {"version", "git_sha", "git_dirty", "build_type", "cuda_archs"})
      if (t.contains(k)) benchmark::AddCustomContext(std::string("punica_") + k, t[k].is_string() ? t[k].get<std::string>() : t[k].dump());
    benchmark::AddCustomContext("punica_scenario", scenario);
  }
  if (!cuda_available()) {
    std::fprintf(stderr, "skipped: punica-microbench needs a CUDA device\n");
    return 4;
  }
  try {
    static std::unique_ptr<Backend> be = make_cuda_backend(nullptr, 0);
    static Scenario sc = load_scenario(scenario);
    std::regex re(filter.empty() ? ".*" : filter);
    int n = 0;
    for (const Case& c : sc.cases) {
      if (!c.skip_reason.empty() || !is_registered_op(c.op) || c.tp > 1 || !std::regex_search(c.id, re)) continue;
      ++n;
      benchmark::RegisterBenchmark(c.id.c_str(), [&c](benchmark::State& state) {
        // Google Benchmark calls this several times per case (growing iteration counts): the
        // inputs (up to 64 rotated copies, generated on the CPU) are made once per case and kept
        // until the next case starts; one case's device memory at a time.
        if (g_held_case != &c) {
          g_held.reset();
          g_held_case = nullptr;
          g_held = std::make_unique<Prepared>(prepare(*be, c));
          g_held_case = &c;
        }
        Prepared& p = *g_held;
        Work w = p.problem->work();
        std::size_t i = 0;
        for (auto _ : state) {
          auto t = be->time_iterations(0, 1, [&](int) { p.problem->run(*be, p.ptrs[i++ % p.ptrs.size()]); });
          state.SetIterationTime(t[0] * 1e-6);
        }
        state.SetBytesProcessed(int64_t(w.bytes) * state.iterations());
        state.SetItemsProcessed(w.tokens * state.iterations());
        state.counters["floor_bytes"] = w.bytes;
      })->UseManualTime()->Unit(benchmark::kMicrosecond);
    }
    if (n == 0) {
      std::fprintf(stderr, "punica-microbench: no case of %s matches '%s'\n", scenario.c_str(), filter.c_str());
      return 2;
    }
    benchmark::RunSpecifiedBenchmarks();
    g_held.reset();
    benchmark::Shutdown();
  } catch (const Error& e) {
    g_held.reset();  // its buffers go back to the backend while it exists
    std::fprintf(stderr, "punica-microbench: error: %s\n", e.what());
    return e.exit_code();
  }
  return 0;
}
