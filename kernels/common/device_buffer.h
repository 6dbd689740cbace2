// Owning device allocation (cudaMalloc/cudaFree) and the small device utilities every op and test
// needs: fills with a 16/32-bit pattern (NaN poisoning, guard canaries) and a GPU count that is 0,
// not an error, on machines without a driver.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cuda_runtime_api.h>

namespace punica::kernels {

class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(std::size_t bytes);
  ~DeviceBuffer();
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& o) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept;

  void* get() const { return ptr_; }
  template <class T> T* as() const { return static_cast<T*>(ptr_); }
  std::size_t bytes() const { return bytes_; }
  void upload(const void* host, std::size_t bytes, std::size_t offset = 0);
  void download(void* host, std::size_t bytes, std::size_t offset = 0) const;

 private:
  void* ptr_ = nullptr;
  std::size_t bytes_ = 0;
};

// Number of usable GPUs; 0 (never throws) when there is no device or no driver.
int gpu_count();

// Fill n elements of `elem_bytes` (2 or 4) with `pattern` on `stream`.
void device_fill_pattern(void* ptr, std::size_t n, int elem_bytes, uint32_t pattern,
                         cudaStream_t stream);

// Fill n bf16 elements with hash_uniform(key, i) in [-1, 1) rounded to nearest (hash_rng.h), the
// same values the host generator gives: realistic operands for the GEMM ceiling, whose tensor
// rate depends on how many bits toggle (a constant fill draws less power and clocks higher).
void device_fill_uniform_bf16(void* ptr, std::size_t n, uint64_t key, cudaStream_t stream);

}  // namespace punica::kernels

namespace punica::kernels {
// An empty kernel, to measure the per-node cost of a CUDA graph (run.ceilings.graph_node_us).
void launch_noop_kernel(cudaStream_t stream);
}  // namespace punica::kernels

namespace punica::kernels {
// NCCL all-gather leaves [tp][rows][cols]; vLLM's all_gather concatenates along the last dim:
// out[i][r*cols + c] = in[r][i][c].
void launch_rank_blocks_to_last_dim(const float* in, float* out, int64_t rows, int64_t cols, int tp,
                                    cudaStream_t stream);
}  // namespace punica::kernels
