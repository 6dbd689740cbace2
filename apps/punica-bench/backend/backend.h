// A Backend is where tensors live, how the ops run and how ranks talk (DESIGN §1): CudaBackend
// (our kernels + cuBLAS + NCCL) and CpuBackend (the Eigen reference + MPI collectives). The runner,
// the op problems and the TP layers are written once against this interface.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>
#include <nlohmann/json.hpp>
#include "kernels/common/dtype.h"
#include "kernels/common/error.h"
#include "kernels/moe_base/moe_base.h"
#include "apps/punica-bench/backend/kernel_choice.h"

namespace punica::bench {

class Dist;

struct Ceilings {
  double copy_gb_per_s = 0;     // measured device copy bandwidth (read + write bytes / time)
  double gemm_bf16_tflops = 0;  // measured dense bf16 GEMM rate (0 on the CPU backend)
  double graph_node_us = 0;     // per-node time of an empty kernel in a graph of many
};

// Base linear y[T, N] = x[T, K] @ W[N, K]^T (+ bias[N]) (+ y if accumulate).
struct LinearArgs {
  kernels::DType dtype = kernels::DType::bf16;
  int64_t m = 0, n = 0, k = 0;
  const void* x = nullptr;   // [m, k]
  const void* w = nullptr;   // [n, k]
  const void* bias = nullptr;
  void* y = nullptr;         // [m, n], row stride ldy
  int64_t ldy = 0;
  bool accumulate = false;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;  // "cpu" | "cuda"
  virtual nlohmann::json device_info() const = 0;
  // L2 size in bytes (inputs rotate over 2x this for cold timing); 0 = no rotation.
  virtual std::size_t l2_bytes() const = 0;
  virtual std::size_t free_memory_bytes() const = 0;

  // ---- memory (pointers are in the backend's space) ----
  virtual void* alloc(std::size_t bytes) = 0;
  virtual void release(void* p) = 0;
  virtual void upload(void* dst, const void* src, std::size_t bytes) = 0;
  virtual void download(void* dst, const void* src, std::size_t bytes) = 0;
  virtual void copy(void* dst, const void* src, std::size_t bytes) = 0;
  virtual void fill_pattern(void* p, std::size_t n, int elem_bytes, uint32_t pattern) = 0;
  virtual void zero(void* p, std::size_t bytes) = 0;
  virtual void synchronize() = 0;

  // ---- running an op (its registry entry, apps/punica-bench/ops, picks the two bodies) ----
  // `cuda(stream)` launches the op's kernels on the CUDA backend's stream (a cudaStream_t);
  // `cpu()` runs its Eigen reference on the CPU backend. Asynchronous where the backend is.
  virtual void exec(const std::function<void(void* stream)>& cuda, const std::function<void()>& cpu) = 0;
  // `--kernel`: a fixed kernel for every lora_shrink / lora_expand call after this one (the ops and
  // the fully sharded layers' shrink / expand); only the CUDA backend has kernels to choose from.
  void set_kernel_choice(const KernelChoice& c) {
    PUNICA_REQUIRE(!c.any() || name() == "cuda", ErrorKind::usage,
                   "--kernel: the " + name() + " backend has no kernels to choose (use --backend cuda)");
    choice_ = c;
  }
  const KernelChoice& kernel_choice() const { return choice_; }
  // The base layer's GEMM (cuBLAS on the GPU) and its helpers, for the TP layers.
  virtual void base_linear(const LinearArgs& a) = 0;
  // TP layers (apps/punica-bench/layers): the base layer's bias, y[i, c] = round(y[i, c] + bias[c])
  // (base_linear on CUDA takes no bias), and VocabParallelEmbedding's masked lookup of the rank's
  // vocabulary rows [vocab_begin, vocab_end): y[t] = table[ids[t] - vocab_begin] or 0 outside.
  virtual void add_bias(void* y, const void* bias, kernels::DType dt, int64_t rows, int64_t cols,
                        int64_t ldy) = 0;
  virtual void embedding_lookup(void* y, const void* table, const int32_t* ids, kernels::DType dt,
                                int64_t num_tokens, int64_t dim, int64_t vocab_begin, int64_t vocab_end,
                                int64_t ldy) = 0;

  // The MoE layer's base experts (SPEC §4.1; kernels/moe_base/moe_base.h on CUDA): a row gather
  // dst[i] = idx[i] < 0 ? 0 : round(scale[i] * src[idx[i]]) (scale null = a copy), act_and_mul,
  // moe_sum, and the expert GEMMs of one step as one call (entries with m = 0 are skipped): one GEMM
  // per entry, or with `ptr_table` (device memory of 3 pointers per entry) one cuBLAS grouped GEMM.
  virtual void gather_rows(void* dst, const void* src, const int32_t* idx, const float* scale, kernels::DType dt,
                           int64_t rows, int64_t cols, int64_t ld_dst, int64_t ld_src) = 0;
  virtual void moe_activation(void* out, const void* in, kernels::DType dt, int64_t rows, int64_t inter,
                              kernels::MoeAct act) = 0;
  virtual void moe_sum(void* out, const void* in, kernels::DType dt, int64_t tokens, int top_k, int64_t cols) = 0;
  virtual void grouped_linear(const std::vector<LinearArgs>& gemms, void* ptr_table) = 0;

  // ---- collectives inside the TP group (consecutive ranks of size tp) ----
  // fp32 all-gather along the leading dim: out = [tp][count] in rank order.
  virtual void all_gather_f32(const float* in, float* out, std::size_t count, int tp) = 0;
  virtual void all_reduce_sum_f32(float* inout, std::size_t count, int tp) = 0;
  // vLLM tensor_model_parallel_all_gather of fp32 [rows, cols] per rank: out = [rows, tp*cols],
  // rank rho's block at columns [rho*cols, (rho+1)*cols). `tmp` holds tp*rows*cols floats.
  virtual void all_gather_last_dim_f32(const float* in, float* out, float* tmp, int64_t rows, int64_t cols,
                                       int tp) = 0;
  // Element-wise sum over the group for dtype data (fp32 accumulate for 16-bit).
  virtual void all_reduce_sum(void* inout, kernels::DType dt, std::size_t count, int tp) = 0;

  // ---- timing ----
  // Per-iteration times (µs) of body(i), i = 0..iters-1, after `warmup` untimed calls.
  virtual std::vector<double> time_iterations(int warmup, int iters,
                                              const std::function<void(int)>& body) = 0;
  // Back-to-back time per call (µs): `calls` calls of body(i) issued together (a CUDA graph on
  // the GPU), replayed `replays` times; returns total / (calls * replays). Negative = unsupported.
  virtual double time_batch(int calls, int replays, const std::function<void(int)>& body) = 0;
  // Nodes (kernels, memsets, copies) of the last time_batch's CUDA graph, all its calls together;
  // -1 where the batch is no graph.
  virtual int64_t last_batch_nodes() const { return -1; }
  virtual std::string timing_method() const = 0;
  // Whether the last time_iterations ran its timed launches queued behind a hold (the GPU never
  // waited for the host inside an event pair; CudaBackend, kernels/common/stream_hold.h).
  virtual bool last_timing_held() const { return false; }
  virtual Ceilings measure_ceilings() = 0;

  // cuBLAS baselines (µs, cold over rotated copies where possible); negative = unavailable.
  // accumulate: y = x W^T + y (beta = 1, y read and written), as an accumulating op does.
  virtual double baseline_gemm_us(kernels::DType dt, int64_t m, int64_t n, int64_t k, int iters, bool accumulate) = 0;
  struct Group { int64_t m, n, k; };
  // One set of per-group GEMMs (y_g = x_g W_g^T (+ y_g)) over inputs permuted beforehand, timed two
  // ways (issue 44): one cublasGemmGroupedBatchedEx call, and one cublasGemmEx per group captured
  // in one CUDA graph (a launch of the graph per call). Negative = unavailable.
  struct GroupedTimes { double batched_us = -1, graph_us = -1; };
  virtual GroupedTimes baseline_grouped_gemm_us(kernels::DType dt, const std::vector<Group>& groups, int iters,
                                                bool accumulate) = 0;
  // The speed of light of a case's own size: a device-to-device copy that moves `bytes` in all
  // (bytes / 2 read, bytes / 2 written), timed as the case is: cold (median of `iters`, each copy on
  // a region that the others have pushed out of L2) and back to back (`calls` copies in one CUDA
  // graph). The floor (DESIGN §7) prices the same bytes at the 1 GiB copy's rate, which a copy of a
  // few MB does not reach. Negative = unavailable (no GPU, or not enough memory for the regions).
  struct CopyBaseline { double cold_us = -1, batch_us = -1; };
  virtual CopyBaseline baseline_copy_us(std::size_t /*bytes*/, int /*iters*/, int /*calls*/) { return {}; }

 private:
  KernelChoice choice_;
};

// RAII buffer in a backend's memory.
class Buffer {
 public:
  Buffer() = default;
  Buffer(Backend& be, std::size_t bytes) : be_(&be), bytes_(bytes), p_(bytes ? be.alloc(bytes) : nullptr) {}
  ~Buffer() { if (p_) be_->release(p_); }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  Buffer(Buffer&& o) noexcept : be_(o.be_), bytes_(o.bytes_), p_(o.p_) { o.p_ = nullptr; o.bytes_ = 0; }
  Buffer& operator=(Buffer&& o) noexcept {
    if (this != &o) { if (p_) be_->release(p_); be_ = o.be_; bytes_ = o.bytes_; p_ = o.p_; o.p_ = nullptr; o.bytes_ = 0; }
    return *this;
  }
  void* get() const { return p_; }
  std::size_t bytes() const { return bytes_; }

 private:
  Backend* be_ = nullptr;
  std::size_t bytes_ = 0;
  void* p_ = nullptr;
};

// The CUDA runtime's and NCCL's versions ("13.0", "2.28.3"), for the result's tool block.
struct ToolkitVersions {
  std::string cuda_runtime, nccl;
};
ToolkitVersions toolkit_versions();

// Backend factories. `dist` may be null (single process). make_cuda throws Error(environment)
// when no GPU is usable.
std::unique_ptr<Backend> make_cpu_backend(const Dist* dist);
std::unique_ptr<Backend> make_cuda_backend(const Dist* dist, int local_rank);
bool cuda_available();

}  // namespace punica::bench
