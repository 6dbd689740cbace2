// Probe (not part of the suite's build): a kernel timeline for a machine without nsys. A CUPTI
// injection library: the CUDA driver loads it when CUDA_INJECTION64_PATH names it, and it records
// every kernel's start and end (CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, which keeps kernels
// concurrent, so a programmatic dependent launch still overlaps its primary) into a CSV written at
// exit. The program under it is not changed or rebuilt, e.g. (one command line each):
//   CUDA_INJECTION64_PATH=$PWD/kernel_trace.so PUNICA_TRACE_OUT=chain.csv PUNICA_TRACE_FILTER='shrink|expand'
//     punica-bench run --backend cuda --no-baselines -f 'add_lora_linear/...' scenarios/bench_lora_ops.json
// then scripts/lab/trace_chain.py chain.csv (each shrink -> expand chain: durations, overlap, span).
//   PUNICA_TRACE_OUT     the CSV (default kernel_trace.csv); written to OUT.tmp, then renamed
//   PUNICA_TRACE_FILTER  ECMAScript regex over the (mangled) kernel name; default: every kernel
// Columns: name,start_ns,end_ns,stream,grid_x,grid_y,grid_z,block_x,correlation,graph_id,graph_node_id
// (graph_id 0: an ordinary launch; start / end are the GPU's timestamps, ns). CUPTI's own cost per
// kernel is small but not zero: compare timelines with each other, not with the bench's times.
// Built by CMake as build/kernel_trace.so (target kernel_trace, wherever the toolkit has CUPTI;
// scripts/stage_device.sh carries it with its libcupti in .carry/lib), or by hand (one command line;
// no libcuda at link time):
//   g++ -O2 -std=c++17 -shared -fPIC -o kernel_trace.so scripts/lab/probes/kernel_trace.cpp
//     -I/usr/local/cuda/include -L/usr/local/cuda/lib64 -lcupti -Wl,-rpath,/usr/local/cuda/lib64
// First run on the H200 in NOTES v37: the chain's shrink durations within 2-3% of ncu's (NOTES v36 part 2).
#include <cupti.h>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <optional>
#include <regex>
#include <string>
#include <vector>

namespace {

struct Rec {
  std::string name;
  uint64_t start, end;
  uint32_t stream, correlation, graph_id;
  int32_t gx, gy, gz, bx;
  uint64_t graph_node;
};

std::mutex g_mu;
std::vector<Rec> g_recs;
std::optional<std::regex> g_filter;
uint64_t g_dropped = 0;
constexpr size_t kBufBytes = 8u << 20;

#define TRACE_CHECK(call)                                                                  \
  do {                                                                                     \
    CUptiResult r_ = (call);                                                               \
    if (r_ != CUPTI_SUCCESS) {                                                             \
      const char* s_ = nullptr;                                                            \
      cuptiGetResultString(r_, &s_);                                                       \
      std::fprintf(stderr, "kernel_trace: %s failed: %s\n", #call, s_ ? s_ : "unknown"); \
      return;                                                                              \
    }                                                                                      \
  } while (0)

void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, kBufBytes));
  *size = *buffer ? kBufBytes : 0;
  *max_records = 0;
}

void CUPTIAPI buffer_completed(CUcontext ctx, uint32_t stream, uint8_t* buffer, size_t, size_t valid) {
  CUpti_Activity* rec = nullptr;
  std::lock_guard<std::mutex> lock(g_mu);
  while (cuptiActivityGetNextRecord(buffer, valid, &rec) == CUPTI_SUCCESS) {
    if (rec->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) continue;  // the one kind enabled
    const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(rec);
    const std::string name = k->name ? k->name : "?";
    if (g_filter && !std::regex_search(name, *g_filter)) continue;
    g_recs.push_back(Rec{name, k->start, k->end, k->streamId, k->correlationId, k->graphId, k->gridX, k->gridY,
                         k->gridZ, k->blockX, k->graphNodeId});
  }
  size_t dropped = 0;
  // drops are counted per buffer's context and stream, the ones this callback was given
  if (cuptiActivityGetNumDroppedRecords(ctx, stream, &dropped) == CUPTI_SUCCESS) g_dropped += dropped;
  std::free(buffer);
}

void write_csv() {
  cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
  const char* env = std::getenv("PUNICA_TRACE_OUT");
  const std::string out = env && *env ? env : "kernel_trace.csv";
  const std::string tmp = out + ".tmp";
  std::lock_guard<std::mutex> lock(g_mu);
  // On the H200 (results/NOTES.md v37) this runs twice at exit: "366 kernels", then a second call that
  // finds no records and had replaced the CSV with an empty one. An environment guard in start() (one
  // tracer per process) did not stop it, so the cause is not known; never replace a trace with an empty one.
  if (g_recs.empty()) {
    std::fprintf(stderr, "kernel_trace: 0 kernels recorded%s; %s not written\n",
                 g_dropped ? " (CUPTI dropped some records)" : "", out.c_str());
    return;
  }
  FILE* f = std::fopen(tmp.c_str(), "w");
  if (!f) {
    std::fprintf(stderr, "kernel_trace: cannot write %s\n", tmp.c_str());
    return;
  }
  std::fprintf(f, "name,start_ns,end_ns,stream,grid_x,grid_y,grid_z,block_x,correlation,graph_id,graph_node_id\n");
  for (const Rec& r : g_recs)
    std::fprintf(f, "%s,%llu,%llu,%u,%d,%d,%d,%d,%u,%u,%llu\n", r.name.c_str(), (unsigned long long)r.start,
                 (unsigned long long)r.end, r.stream, r.gx, r.gy, r.gz, r.bx, r.correlation, r.graph_id,
                 (unsigned long long)r.graph_node);
  const bool ok = std::fclose(f) == 0 && std::rename(tmp.c_str(), out.c_str()) == 0;
  std::fprintf(stderr, "kernel_trace: %zu kernels%s -> %s%s\n", g_recs.size(),
               g_dropped ? " (CUPTI dropped some records)" : "", out.c_str(), ok ? "" : " (FAILED)");
}

void start() {
  if (const char* f = std::getenv("PUNICA_TRACE_FILTER"); f && *f) {
    try {
      g_filter.emplace(f, std::regex::ECMAScript);
    } catch (const std::regex_error&) {
      std::fprintf(stderr, "kernel_trace: PUNICA_TRACE_FILTER '%s' is not a valid regular expression\n", f);
      std::exit(2);
    }
  }
  TRACE_CHECK(cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed));
  TRACE_CHECK(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL));
  std::atexit(write_csv);
}

}  // namespace

// The CUDA driver's entry point for an injection library (CUDA_INJECTION64_PATH).
extern "C" __attribute__((visibility("default"))) int InitializeInjection(void) {
  static std::once_flag once;
  std::call_once(once, start);
  return 1;
}
