// The probes' common part (not part of the suite's build): a checked-call macro and the timing the
// way punica-bench times an op. Cold = CUDA events around one call, calls enqueued back to back
// (the caller rotates buffers past 2x L2), median of 30; graph = one CUDA graph of 32 calls, per call.
#pragma once
#include <cuda_runtime.h>
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <vector>

#define CK(x)                                                                               \
  do {                                                                                      \
    cudaError_t e_ = (x);                                                                   \
    if (e_ != cudaSuccess) {                                                                \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      std::exit(1);                                                                         \
    }                                                                                       \
  } while (0)

static double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

static void time_it(const char* name, double bytes, const std::function<void(int, cudaStream_t)>& body, cudaStream_t st) {
  for (int i = 0; i < 3; ++i) body(i, st);
  const int iters = 30;
  std::vector<cudaEvent_t> ev(2 * iters);
  for (auto& e : ev) CK(cudaEventCreate(&e));
  for (int i = 0; i < iters; ++i) {
    CK(cudaEventRecord(ev[2 * i], st));
    body(i, st);
    CK(cudaEventRecord(ev[2 * i + 1], st));
  }
  CK(cudaStreamSynchronize(st));
  std::vector<double> t(iters);
  for (int i = 0; i < iters; ++i) {
    float ms;
    CK(cudaEventElapsedTime(&ms, ev[2 * i], ev[2 * i + 1]));
    t[i] = ms * 1e3;
  }
  for (auto& e : ev) CK(cudaEventDestroy(e));
  // graph of 32 calls
  cudaGraph_t g;
  cudaGraphExec_t ge;
  CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
  for (int i = 0; i < 32; ++i) body(i, st);
  CK(cudaStreamEndCapture(st, &g));
  CK(cudaGraphInstantiate(&ge, g, 0));
  CK(cudaGraphLaunch(ge, st));
  std::vector<double> gt;
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  for (int r = 0; r < 5; ++r) {
    CK(cudaEventRecord(a, st));
    CK(cudaGraphLaunch(ge, st));
    CK(cudaEventRecord(b, st));
    CK(cudaEventSynchronize(b));
    float ms;
    CK(cudaEventElapsedTime(&ms, a, b));
    gt.push_back(ms * 1e3 / 32);
  }
  CK(cudaGraphExecDestroy(ge));
  CK(cudaGraphDestroy(g));
  const double c = median(t), gr = median(gt);
  CK(cudaGetLastError());
  std::printf("PROBE %-40s bytes %10.0f  cold %8.2f us (%6.0f GB/s)  graph %8.2f us (%6.0f GB/s)\n", name, bytes, c,
              bytes > 0 ? bytes / c / 1e3 : 0.0, gr, bytes > 0 ? bytes / gr / 1e3 : 0.0);
  std::fflush(stdout);
}
