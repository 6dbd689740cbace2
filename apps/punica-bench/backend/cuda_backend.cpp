// CudaBackend: device memory, our CUDA kernels on one stream, cuBLAS for the base linear and the
// baselines, NCCL for the TP collectives (unique id broadcast over MPI), CUDA events and graphs
// for timing (DESIGN §7). Device = local rank.
#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <nccl.h>
#include <algorithm>
#include <cstring>
#include <map>
#include <memory>
#include "apps/punica-bench/backend/backend.h"
#include "apps/punica-bench/dist.h"
#include "kernels/common/cuda_check.h"
#include "kernels/common/device_buffer.h"
#include "kernels/common/error.h"
#include "kernels/common/hash_rng.h"
#include "kernels/common/layer_util.h"
#include "kernels/common/stream_hold.h"
#include "kernels/lora_shrink/lora_shrink.h"  // wgmma_available (device_info)

#define PUNICA_CUBLAS_CHECK(expr)                                                              \
  do {                                                                                         \
    cublasStatus_t s_ = (expr);                                                                \
    if (s_ != CUBLAS_STATUS_SUCCESS)                                                           \
      ::punica::fail(::punica::ErrorKind::runtime, std::string("cuBLAS error ") +              \
                                                       cublasGetStatusString(s_) + " in " #expr \
                                                       " at " + ::punica::where(__FILE__, __LINE__)); \
  } while (0)
#define PUNICA_NCCL_CHECK(expr)                                                                \
  do {                                                                                         \
    ncclResult_t r_ = (expr);                                                                  \
    if (r_ != ncclSuccess)                                                                     \
      ::punica::fail(::punica::ErrorKind::runtime, std::string("NCCL error ") +                \
                                                       ncclGetErrorString(r_) + " in " #expr   \
                                                       " at " + ::punica::where(__FILE__, __LINE__)); \
  } while (0)

namespace punica::bench {

ToolkitVersions toolkit_versions() {
  int rt = 0, nccl = 0;
  ToolkitVersions v;
  if (cudaRuntimeGetVersion(&rt) == cudaSuccess)
    v.cuda_runtime = std::to_string(rt / 1000) + "." + std::to_string((rt % 1000) / 10);
  if (ncclGetVersion(&nccl) == ncclSuccess)
    v.nccl = std::to_string(nccl / 10000) + "." + std::to_string((nccl / 100) % 100) + "." + std::to_string(nccl % 100);
  return v;
}

bool cuda_available() { return kernels::gpu_count() > 0; }

namespace {
using kernels::DType;

cudaDataType_t cuda_type(DType t) {
  switch (t) {
    case DType::f16: return CUDA_R_16F;
    case DType::bf16: return CUDA_R_16BF;
    default: return CUDA_R_32F;
  }
}
ncclDataType_t nccl_type(DType t) {
  switch (t) {
    case DType::f16: return ncclFloat16;
    case DType::bf16: return ncclBfloat16;
    default: return ncclFloat32;
  }
}
double median(std::vector<double> v) {
  if (v.empty()) return -1;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}
// Events, a graph and its executable that are destroyed on every way out of the timing loops,
// an error included (return codes of the destroys are ignored: they run during unwinding).
struct Events {
  std::vector<cudaEvent_t> ev;
  explicit Events(std::size_t n) {
    ev.reserve(n);
    try {
      for (std::size_t i = 0; i < n; ++i) {
        cudaEvent_t e = nullptr;
        PUNICA_CUDA_CHECK(cudaEventCreate(&e));
        ev.push_back(e);
      }
    } catch (...) {
      destroy();  // a throwing constructor runs no destructor
      throw;
    }
  }
  ~Events() { destroy(); }
  void destroy() {
    for (auto e : ev) cudaEventDestroy(e);
    ev.clear();
  }
  Events(const Events&) = delete;
  Events& operator=(const Events&) = delete;
  cudaEvent_t operator[](std::size_t i) const { return ev[i]; }
};
struct Graph {
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  Graph() = default;
  ~Graph() {
    if (exec) cudaGraphExecDestroy(exec);
    if (graph) cudaGraphDestroy(graph);
  }
  Graph(const Graph&) = delete;
  Graph& operator=(const Graph&) = delete;
};

class CudaBackend final : public Backend {
 public:
  CudaBackend(const Dist* dist, int local_rank) : dist_(dist) {
    int n = kernels::gpu_count();
    PUNICA_REQUIRE(n > 0, ErrorKind::environment, "no CUDA device is available (use --backend cpu)");
    device_ = local_rank % n;
    PUNICA_CUDA_CHECK(cudaSetDevice(device_));
    PUNICA_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    PUNICA_CUBLAS_CHECK(cublasCreate(&cublas_));
    PUNICA_CUBLAS_CHECK(cublasSetStream(cublas_, stream_));
    workspace_ = kernels::DeviceBuffer(std::size_t(32) << 20);
    PUNICA_CUBLAS_CHECK(cublasSetWorkspace(cublas_, workspace_.get(), workspace_.bytes()));
    PUNICA_CUDA_CHECK(cudaGetDeviceProperties(&prop_, device_));
    hold_ = std::make_unique<kernels::StreamHold>();  // after cudaSetDevice: pinned memory in this context
  }
  ~CudaBackend() override {
    for (auto& kv : comms_) ncclCommDestroy(kv.second);
    if (cublas_) cublasDestroy(cublas_);
    if (stream_) cudaStreamDestroy(stream_);
  }
  std::string name() const override { return "cuda"; }
  nlohmann::json device_info() const override {
    char bus[32] = {0};
    cudaDeviceGetPCIBusId(bus, sizeof bus, device_);
    int mem_clock_khz = 0, bus_width = 0;
    cudaDeviceGetAttribute(&mem_clock_khz, cudaDevAttrMemoryClockRate, device_);
    cudaDeviceGetAttribute(&bus_width, cudaDevAttrGlobalMemoryBusWidth, device_);
    int rt = 0, drv = 0;
    cudaRuntimeGetVersion(&rt);
    cudaDriverGetVersion(&drv);
    return {{"device", device_},
            {"name", prop_.name},
            {"pci_bus_id", bus},
            {"cc", std::to_string(prop_.major) + "." + std::to_string(prop_.minor)},
            {"sms", prop_.multiProcessorCount},
            {"l2_bytes", prop_.l2CacheSize},
            {"mem_bytes", double(prop_.totalGlobalMem)},
            {"peak_mem_bw_bytes_per_s", 2.0 * mem_clock_khz * 1e3 * bus_width / 8.0},
            {"cuda_runtime", rt},
            {"cuda_driver", drv},
            // the shrink's wgmma tile can run (sm_90a code in this build, a 9.0 device): the automatic
            // kernel choice, and so the timings, depend on it
            {"wgmma_shrink_tile", kernels::wgmma_available()}};
  }
  std::size_t l2_bytes() const override { return std::size_t(prop_.l2CacheSize); }
  std::size_t free_memory_bytes() const override {
    std::size_t f = 0, t = 0;
    PUNICA_CUDA_CHECK(cudaMemGetInfo(&f, &t));
    return f;
  }

  void* alloc(std::size_t bytes) override {
    void* p = nullptr;
    PUNICA_CUDA_CHECK(cudaMalloc(&p, std::max<std::size_t>(bytes, 16)));
    return p;
  }
  void release(void* p) override { cudaFree(p); }
  void upload(void* d, const void* s, std::size_t n) override {
    if (n) PUNICA_CUDA_CHECK(cudaMemcpyAsync(d, s, n, cudaMemcpyHostToDevice, stream_));
    synchronize();
  }
  void download(void* d, const void* s, std::size_t n) override {
    if (n) PUNICA_CUDA_CHECK(cudaMemcpyAsync(d, s, n, cudaMemcpyDeviceToHost, stream_));
    synchronize();
  }
  void copy(void* d, const void* s, std::size_t n) override {
    if (n) PUNICA_CUDA_CHECK(cudaMemcpyAsync(d, s, n, cudaMemcpyDeviceToDevice, stream_));
  }
  void fill_pattern(void* p, std::size_t n, int eb, uint32_t pat) override {
    kernels::device_fill_pattern(p, n, eb, pat, stream_);
  }
  void zero(void* p, std::size_t n) override {
    if (n) PUNICA_CUDA_CHECK(cudaMemsetAsync(p, 0, n, stream_));
  }
  void synchronize() override { PUNICA_CUDA_CHECK(cudaStreamSynchronize(stream_)); }

  void exec(const std::function<void(void*)>& cuda, const std::function<void()>&) override { cuda(stream_); }
  void base_linear(const LinearArgs& a) override {
    if (a.m == 0 || a.n == 0) return;
    PUNICA_REQUIRE(a.bias == nullptr, ErrorKind::runtime,
                   "CudaBackend::base_linear: the bias is added by the layer, not here");
    float alpha = 1.0f, beta = a.accumulate ? 1.0f : 0.0f;
    // Row-major y[m,n] = x[m,k] W[n,k]^T  ==  column-major y^T[n,m] = W^T' ... (see file header)
    PUNICA_CUBLAS_CHECK(cublasGemmEx(cublas_, CUBLAS_OP_T, CUBLAS_OP_N, int(a.n), int(a.m), int(a.k), &alpha,
                                     a.w, cuda_type(a.dtype), int(a.k), a.x, cuda_type(a.dtype), int(a.k),
                                     &beta, a.y, cuda_type(a.dtype), int(a.ldy), CUBLAS_COMPUTE_32F,
                                     CUBLAS_GEMM_DEFAULT));
  }
  void add_bias(void* y, const void* bias, DType dt, int64_t rows, int64_t cols, int64_t ldy) override {
    kernels::launch_add_bias(y, bias, dt, rows, cols, ldy, stream_);
  }
  void embedding_lookup(void* y, const void* table, const int32_t* ids, DType dt, int64_t T, int64_t dim,
                        int64_t begin, int64_t end, int64_t ldy) override {
    kernels::launch_embedding_lookup(y, table, ids, dt, T, dim, begin, end, ldy, stream_);
  }

  void gather_rows(void* dst, const void* src, const int32_t* idx, const float* scale, DType dt, int64_t rows,
                   int64_t cols, int64_t ld_dst, int64_t ld_src) override {
    kernels::launch_moe_gather_rows(dst, src, idx, scale, dt, rows, cols, ld_dst, ld_src, stream_);
  }
  void moe_activation(void* out, const void* in, DType dt, int64_t rows, int64_t inter, kernels::MoeAct act) override {
    kernels::launch_moe_activation(out, in, dt, rows, inter, act, stream_);
  }
  void moe_sum(void* out, const void* in, DType dt, int64_t tokens, int top_k, int64_t cols) override {
    kernels::launch_moe_sum(out, in, dt, tokens, top_k, cols, stream_);
  }
  // Without a table: one cublasGemmEx per entry (host group sizes, no device pointer table). With one:
  // a kernel writes the A/B/C pointers into it (parameters, no host copy: graph capturable) and one
  // cublasGemmGroupedBatchedEx runs every entry (group sizes 1, as the grouped baseline).
  void grouped_linear(const std::vector<LinearArgs>& gemms, void* ptr_table) override {
    std::vector<const LinearArgs*> g;
    for (const auto& a : gemms)
      if (a.m > 0 && a.n > 0) g.push_back(&a);
    const int G = int(g.size());
    if (!ptr_table || G == 0 || 3 * G > kernels::kMoePtrPackMax) {
      for (const auto* a : g) base_linear(*a);
      return;
    }
    kernels::MoePtrPack pk;
    pk.n = 3 * G;
    std::vector<int> ms(G), ns(G), ks(G), lda(G), ldb(G), ldc(G), gs(G, 1);
    std::vector<float> alpha(G, 1.f), beta(G);
    std::vector<cublasOperation_t> ta(G, CUBLAS_OP_T), tb(G, CUBLAS_OP_N);
    const DType dt = g[0]->dtype;
    for (int i = 0; i < G; ++i) {
      const LinearArgs& a = *g[i];
      PUNICA_REQUIRE(a.dtype == dt && a.bias == nullptr, ErrorKind::runtime,
                     "CudaBackend::grouped_linear: mixed dtypes or a bias");
      // row-major y[m,n] = x[m,k] W[n,k]^T as base_linear: column-major C[n,m] = W^T' x
      ms[i] = int(a.n); ns[i] = int(a.m); ks[i] = int(a.k);
      lda[i] = int(a.k); ldb[i] = int(a.k); ldc[i] = int(a.ldy);
      beta[i] = a.accumulate ? 1.f : 0.f;
      pk.p[i] = a.w;
      pk.p[G + i] = a.x;
      pk.p[2 * G + i] = a.y;
    }
    auto** table = static_cast<void**>(ptr_table);
    kernels::launch_moe_write_pointers(table, pk, stream_);
    PUNICA_CUBLAS_CHECK(cublasGemmGroupedBatchedEx(
        cublas_, ta.data(), tb.data(), ms.data(), ns.data(), ks.data(), alpha.data(), (const void* const*)table,
        cuda_type(dt), lda.data(), (const void* const*)(table + G), cuda_type(dt), ldb.data(), beta.data(),
        (void* const*)(table + 2 * G), cuda_type(dt), ldc.data(), G, gs.data(), CUBLAS_COMPUTE_32F));
  }

  void all_gather_f32(const float* in, float* out, std::size_t count, int tp) override {
    if (tp == 1) { copy(out, in, count * 4); return; }
    PUNICA_NCCL_CHECK(ncclAllGather(in, out, count, ncclFloat32, comm(tp), stream_));
  }
  void all_gather_last_dim_f32(const float* in, float* out, float* tmp, int64_t rows, int64_t cols,
                               int tp) override {
    if (tp == 1) { copy(out, in, std::size_t(rows * cols) * 4); return; }
    PUNICA_NCCL_CHECK(ncclAllGather(in, tmp, std::size_t(rows * cols), ncclFloat32, comm(tp), stream_));
    kernels::launch_rank_blocks_to_last_dim(tmp, out, rows, cols, tp, stream_);
  }
  void all_reduce_sum_f32(float* inout, std::size_t count, int tp) override {
    if (tp == 1) return;
    PUNICA_NCCL_CHECK(ncclAllReduce(inout, inout, count, ncclFloat32, ncclSum, comm(tp), stream_));
  }
  void all_reduce_sum(void* inout, DType dt, std::size_t count, int tp) override {
    if (tp == 1) return;
    PUNICA_NCCL_CHECK(ncclAllReduce(inout, inout, count, nccl_type(dt), ncclSum, comm(tp), stream_));
  }

  std::vector<double> time_iterations(int warmup, int iters, const std::function<void(int)>& body) override {
    for (int i = 0; i < warmup; ++i) body(i);
    const Events ev(2 * std::size_t(iters));
    // The timed launches queue up behind a hold and run back to back once released, so the events
    // time the GPU, not the host's launch rate (kernels/common/stream_hold.h). Chunks of
    // kHoldChunk iterations keep the launch queue short; the next chunk's hold sits between two
    // iterations, outside every event pair.
    synchronize();
    hold_->clear_timeout();
    for (int c0 = 0; c0 < iters; c0 += kHoldChunk) {
      hold_->hold(stream_, kHoldTimeoutS);
      const int c1 = std::min(iters, c0 + kHoldChunk);
      try {
        for (int i = c0; i < c1; ++i) {
          PUNICA_CUDA_CHECK(cudaEventRecord(ev[2 * i], stream_));
          body(i);
          PUNICA_CUDA_CHECK(cudaEventRecord(ev[2 * i + 1], stream_));
        }
      } catch (...) {
        hold_->release();  // never leave the stream held behind an error
        throw;
      }
      hold_->release();
    }
    synchronize();
    last_held_ = !hold_->timed_out();
    std::vector<double> t(iters);
    for (int i = 0; i < iters; ++i) {
      float ms = 0;
      PUNICA_CUDA_CHECK(cudaEventElapsedTime(&ms, ev[2 * i], ev[2 * i + 1]));
      t[i] = ms * 1e3;
    }
    return t;
  }
  int64_t last_batch_nodes() const override { return last_batch_nodes_; }
  double time_batch(int calls, int replays, const std::function<void(int)>& body) override {
    Graph g;
    synchronize();
    PUNICA_CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
    try {
      for (int i = 0; i < calls; ++i) body(i);
    } catch (...) {
      cudaStreamEndCapture(stream_, &g.graph);  // ends the capture; g destroys what it made
      throw;
    }
    PUNICA_CUDA_CHECK(cudaStreamEndCapture(stream_, &g.graph));
    std::size_t nodes = 0;
    PUNICA_CUDA_CHECK(cudaGraphGetNodes(g.graph, nullptr, &nodes));
    last_batch_nodes_ = int64_t(nodes);
    PUNICA_CUDA_CHECK(cudaGraphInstantiate(&g.exec, g.graph, 0));
    PUNICA_CUDA_CHECK(cudaGraphLaunch(g.exec, stream_));  // warm-up replay
    const Events ev(2);
    std::vector<double> per;
    for (int r = 0; r < replays; ++r) {
      PUNICA_CUDA_CHECK(cudaEventRecord(ev[0], stream_));
      PUNICA_CUDA_CHECK(cudaGraphLaunch(g.exec, stream_));
      PUNICA_CUDA_CHECK(cudaEventRecord(ev[1], stream_));
      PUNICA_CUDA_CHECK(cudaEventSynchronize(ev[1]));
      float ms = 0;
      PUNICA_CUDA_CHECK(cudaEventElapsedTime(&ms, ev[0], ev[1]));
      per.push_back(ms * 1e3 / calls);
    }
    return median(per);
  }
  std::string timing_method() const override { return "cuda_events"; }
  bool last_timing_held() const override { return last_held_; }

  Ceilings measure_ceilings() override {
    Ceilings c;
    {  // device-to-device copy of 1 GiB: bytes read + written per second
      const std::size_t n = std::size_t(1) << 30;
      kernels::DeviceBuffer a(n), b(n);
      zero(a.get(), n);
      auto t = time_iterations(2, 10, [&](int i) { copy(i % 2 ? a.get() : b.get(), i % 2 ? b.get() : a.get(), n); });
      c.copy_gb_per_s = 2.0 * double(n) / median(t) / 1e3;
    }
    {  // dense bf16 GEMM 8192^3 on uniform random operands: the tensor rate depends on the data
       // (power draw), and the constant fill used up to NOTES v21 part 1 ran faster than real inputs do
      const int64_t m = 8192;
      kernels::DeviceBuffer x(m * m * 2), w(m * m * 2), y(m * m * 2);
      kernels::device_fill_uniform_bf16(x.get(), std::size_t(m * m), splitmix64(1), stream_);
      kernels::device_fill_uniform_bf16(w.get(), std::size_t(m * m), splitmix64(2), stream_);
      LinearArgs la;
      la.dtype = DType::bf16; la.m = la.n = la.k = m; la.x = x.get(); la.w = w.get(); la.y = y.get(); la.ldy = m;
      auto t = time_iterations(3, 10, [&](int) { base_linear(la); });
      c.gemm_bf16_tflops = 2.0 * double(m) * m * m / median(t) / 1e6;
    }
    {  // per-node cost of an empty kernel in a graph of 1000
      c.graph_node_us = time_batch(1000, 5, [&](int) { kernels::launch_noop_kernel(stream_); });
    }
    return c;
  }

  double baseline_gemm_us(DType dt, int64_t m, int64_t n, int64_t k, int iters, bool accumulate) override {
    if (m <= 0 || n <= 0 || k <= 0) return -1;
    std::size_t es = kernels::dtype_size(dt);
    std::size_t set = std::size_t(m * k + n * k + m * n) * es;
    int copies = int(std::clamp<std::size_t>((2 * l2_bytes() + set - 1) / set + 1, 1, 32));
    std::vector<kernels::DeviceBuffer> bufs;
    for (int i = 0; i < copies; ++i) {
      bufs.emplace_back(set);
      kernels::device_fill_pattern(bufs.back().get(), set / 2, 2, 0x3c00, stream_);
    }
    auto t = time_iterations(3, iters, [&](int i) {
      char* base = static_cast<char*>(bufs[i % copies].get());
      LinearArgs la;
      la.dtype = dt; la.m = m; la.n = n; la.k = k;
      la.x = base; la.w = base + m * k * es; la.y = base + (m * k + n * k) * es; la.ldy = n;
      la.accumulate = accumulate;
      base_linear(la);
    });
    return median(t);
  }
  GroupedTimes baseline_grouped_gemm_us(DType dt, const std::vector<Group>& groups, int iters,
                                        bool accumulate) override {
    std::vector<Group> g;
    for (auto& x : groups) if (x.m > 0 && x.n > 0 && x.k > 0) g.push_back(x);
    if (g.empty()) return {};
    const int G = int(g.size());
    std::size_t es = kernels::dtype_size(dt);
    std::vector<std::size_t> off(3 * G + 1, 0);
    std::size_t total = 0;
    for (int i = 0; i < G; ++i) {
      off[3 * i] = total; total += (g[i].m * g[i].k * es + 255) / 256 * 256;
      off[3 * i + 1] = total; total += (g[i].n * g[i].k * es + 255) / 256 * 256;
      off[3 * i + 2] = total; total += (g[i].m * g[i].n * es + 255) / 256 * 256;
    }
    int copies = int(std::clamp<std::size_t>((2 * l2_bytes() + total - 1) / total + 1, 1, 32));
    std::vector<kernels::DeviceBuffer> bufs;
    std::vector<kernels::DeviceBuffer> ptrs;
    std::vector<int> ms(G), ns(G), ks(G), lda(G), ldb(G), ldc(G), gs(G, 1);
    std::vector<float> alpha(G, 1.f), beta(G, accumulate ? 1.f : 0.f);
    std::vector<cublasOperation_t> ta(G, CUBLAS_OP_T), tb(G, CUBLAS_OP_N);
    for (int i = 0; i < G; ++i) {
      ms[i] = int(g[i].n); ns[i] = int(g[i].m); ks[i] = int(g[i].k);
      lda[i] = int(g[i].k); ldb[i] = int(g[i].k); ldc[i] = int(g[i].n);
    }
    for (int c = 0; c < copies; ++c) {
      bufs.emplace_back(total);
      kernels::device_fill_pattern(bufs.back().get(), total / 2, 2, 0x3c00, stream_);
      std::vector<const void*> hp(3 * G);
      char* base = static_cast<char*>(bufs.back().get());
      for (int i = 0; i < G; ++i) {
        hp[i] = base + off[3 * i + 1];          // A = W [n, k]
        hp[G + i] = base + off[3 * i];          // B = x [m, k]
        hp[2 * G + i] = base + off[3 * i + 2];  // C = y
      }
      ptrs.emplace_back(hp.size() * sizeof(void*));
      ptrs.back().upload(hp.data(), hp.size() * sizeof(void*));
    }
    GroupedTimes r;
    r.batched_us = median(time_iterations(3, iters, [&](int it) {
      auto** p = ptrs[it % copies].as<void*>();
      PUNICA_CUBLAS_CHECK(cublasGemmGroupedBatchedEx(
          cublas_, ta.data(), tb.data(), ms.data(), ns.data(), ks.data(), alpha.data(),
          (const void* const*)p, cuda_type(dt), lda.data(), (const void* const*)(p + G), cuda_type(dt),
          ldb.data(), beta.data(), (void* const*)(p + 2 * G), cuda_type(dt), ldc.data(), G, gs.data(),
          CUBLAS_COMPUTE_32F));
    }));
    bool held = last_held_;
    // The same GEMMs as one cublasGemmEx per group (base_linear: cuBLAS's own kernel choice per
    // shape), captured into one graph per rotated copy; a call = one graph launch.
    std::vector<std::unique_ptr<Graph>> graphs;
    for (int c = 0; c < copies; ++c) {
      char* base = static_cast<char*>(bufs[std::size_t(c)].get());
      auto gr = std::make_unique<Graph>();
      synchronize();
      PUNICA_CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
      try {
        for (int i = 0; i < G; ++i) {
          LinearArgs la;
          la.dtype = dt; la.m = g[i].m; la.n = g[i].n; la.k = g[i].k;
          la.x = base + off[3 * i]; la.w = base + off[3 * i + 1]; la.y = base + off[3 * i + 2];
          la.ldy = g[i].n;
          la.accumulate = accumulate;
          base_linear(la);
        }
      } catch (...) {
        cudaStreamEndCapture(stream_, &gr->graph);
        throw;
      }
      PUNICA_CUDA_CHECK(cudaStreamEndCapture(stream_, &gr->graph));
      PUNICA_CUDA_CHECK(cudaGraphInstantiate(&gr->exec, gr->graph, 0));
      graphs.push_back(std::move(gr));
    }
    r.graph_us = median(time_iterations(3, iters, [&](int it) {
      PUNICA_CUDA_CHECK(cudaGraphLaunch(graphs[std::size_t(it % copies)]->exec, stream_));
    }));
    last_held_ = held && last_held_;
    return r;
  }
  CopyBaseline baseline_copy_us(std::size_t bytes, int iters, int calls) override {
    CopyBaseline r;
    const std::size_t half = (bytes / 2 + 255) / 256 * 256;  // each region: src | dst, 256-byte aligned
    if (half == 0 || iters <= 0) return r;
    const std::size_t region = 2 * half;
    // regions over 2x L2 in all, as the case's rotated copies are: a region comes round again only
    // after the others have pushed it out of L2 (a few MB cases take many small regions; a case of
    // some GB two regions, if memory allows)
    std::size_t nreg = std::max<std::size_t>(2, (2 * l2_bytes() + region - 1) / region + 1);
    const std::size_t budget = free_memory_bytes() / 4;
    nreg = std::min(nreg, budget / region);
    if (nreg < 2) return r;
    kernels::DeviceBuffer pool(region * nreg);
    zero(pool.get(), region * nreg);
    char* base = static_cast<char*>(pool.get());
    auto body = [&](int i) {
      char* p = base + std::size_t(i) % nreg * region;
      copy(p + half, p, half);
    };
    r.cold_us = median(time_iterations(3, iters, body));
    if (calls > 0) r.batch_us = time_batch(calls, 5, body);
    return r;
  }

 private:
  int64_t last_batch_nodes_ = -1;
  ncclComm_t comm(int tp) {
    auto it = comms_.find(tp);
    if (it != comms_.end()) return it->second;
    PUNICA_REQUIRE(dist_, ErrorKind::runtime, "tp=" + std::to_string(tp) + " needs an MPI launch");
    ncclUniqueId id;
    if (dist_->rank() % tp == 0) PUNICA_NCCL_CHECK(ncclGetUniqueId(&id));
    dist_->group_bcast(&id, sizeof id, tp);
    ncclComm_t c;
    PUNICA_NCCL_CHECK(ncclCommInitRank(&c, tp, id, dist_->rank() % tp));
    comms_[tp] = c;
    return c;
  }

  const Dist* dist_;
  int device_ = 0;
  cudaStream_t stream_ = nullptr;
  cublasHandle_t cublas_ = nullptr;
  kernels::DeviceBuffer workspace_;
  cudaDeviceProp prop_{};
  std::map<int, ncclComm_t> comms_;
  std::unique_ptr<kernels::StreamHold> hold_;
  bool last_held_ = false;
  static constexpr int kHoldChunk = 32;         // timed iterations queued behind one hold
  static constexpr double kHoldTimeoutS = 2.0;  // a hold gives up after this (then last_held_ = false)
};

}  // namespace

std::unique_ptr<Backend> make_cuda_backend(const Dist* dist, int local_rank) {
  return std::make_unique<CudaBackend>(dist, local_rank);
}

}  // namespace punica::bench
