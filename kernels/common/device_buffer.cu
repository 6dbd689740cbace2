// Device buffers and pattern fills (see device_buffer.h).
#include "kernels/common/device_buffer.h"
#include "kernels/common/cuda_check.h"
#include "kernels/common/hash_rng.h"
#include <cuda_bf16.h>
#include <algorithm>
#include <utility>

namespace punica::kernels {

DeviceBuffer::DeviceBuffer(std::size_t bytes) : bytes_(bytes) {
  if (bytes) PUNICA_CUDA_CHECK(cudaMalloc(&ptr_, bytes));
}
DeviceBuffer::~DeviceBuffer() {
  if (ptr_) cudaFree(ptr_);  // no throw from a destructor; a failed free is reported by the next call
}
DeviceBuffer::DeviceBuffer(DeviceBuffer&& o) noexcept
    : ptr_(std::exchange(o.ptr_, nullptr)), bytes_(std::exchange(o.bytes_, 0)) {}
DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& o) noexcept {
  if (this != &o) {
    if (ptr_) cudaFree(ptr_);
    ptr_ = std::exchange(o.ptr_, nullptr);
    bytes_ = std::exchange(o.bytes_, 0);
  }
  return *this;
}
void DeviceBuffer::upload(const void* host, std::size_t bytes, std::size_t offset) {
  PUNICA_REQUIRE(offset + bytes <= bytes_, ErrorKind::runtime, "DeviceBuffer::upload out of range");
  if (bytes) PUNICA_CUDA_CHECK(cudaMemcpy(static_cast<char*>(ptr_) + offset, host, bytes,
                                          cudaMemcpyHostToDevice));
}
void DeviceBuffer::download(void* host, std::size_t bytes, std::size_t offset) const {
  PUNICA_REQUIRE(offset + bytes <= bytes_, ErrorKind::runtime, "DeviceBuffer::download out of range");
  if (bytes) PUNICA_CUDA_CHECK(cudaMemcpy(host, static_cast<const char*>(ptr_) + offset, bytes,
                                          cudaMemcpyDeviceToHost));
}

int gpu_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no driver" error
    return 0;
  }
  return n;
}

namespace {
template <class T>
__global__ void fill_pattern_kernel(T* p, std::size_t n, T v) {
  for (std::size_t i = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; i < n;
       i += std::size_t(gridDim.x) * blockDim.x)
    p[i] = v;
}
// Grid-stride fills: enough 256-thread blocks for n elements, at most 4096.
unsigned fill_blocks(std::size_t n) { return unsigned(std::min<std::size_t>((n + 255) / 256, 4096)); }
__global__ void fill_uniform_bf16_kernel(__nv_bfloat16* p, std::size_t n, uint64_t key) {
  for (std::size_t i = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; i < n;
       i += std::size_t(gridDim.x) * blockDim.x)
    p[i] = __float2bfloat16_rn(hash_uniform(key, i));
}
}  // namespace

void device_fill_uniform_bf16(void* ptr, std::size_t n, uint64_t key, cudaStream_t stream) {
  if (n == 0) return;
  const unsigned blocks = fill_blocks(n);
  fill_uniform_bf16_kernel<<<blocks, 256, 0, stream>>>(static_cast<__nv_bfloat16*>(ptr), n, key);
  PUNICA_CUDA_CHECK_LAUNCH();
}

void device_fill_pattern(void* ptr, std::size_t n, int elem_bytes, uint32_t pattern,
                         cudaStream_t stream) {
  if (n == 0) return;
  const unsigned blocks = fill_blocks(n);
  if (elem_bytes == 4)
    fill_pattern_kernel<uint32_t><<<blocks, 256, 0, stream>>>(static_cast<uint32_t*>(ptr), n, pattern);
  else if (elem_bytes == 2)
    fill_pattern_kernel<uint16_t><<<blocks, 256, 0, stream>>>(static_cast<uint16_t*>(ptr), n,
                                                              uint16_t(pattern));
  else
    fail(ErrorKind::runtime, "device_fill_pattern: elem_bytes must be 2 or 4");
  PUNICA_CUDA_CHECK_LAUNCH();
}

}  // namespace punica::kernels

namespace punica::kernels {
namespace {
__global__ void noop_kernel() {}
}  // namespace
void launch_noop_kernel(cudaStream_t stream) {
  noop_kernel<<<1, 32, 0, stream>>>();
  PUNICA_CUDA_CHECK_LAUNCH();
}
}  // namespace punica::kernels

namespace punica::kernels {
namespace {
__global__ void rank_blocks_to_last_dim_kernel(const float* in, float* out, int64_t rows, int64_t cols, int tp) {
  const int64_t n = rows * cols * tp;
  for (int64_t o = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; o < n; o += int64_t(gridDim.x) * blockDim.x) {
    int64_t i = o / (cols * tp), rc = o % (cols * tp), r = rc / cols, c = rc % cols;
    out[o] = in[(r * rows + i) * cols + c];
  }
}
}  // namespace
void launch_rank_blocks_to_last_dim(const float* in, float* out, int64_t rows, int64_t cols, int tp,
                                    cudaStream_t stream) {
  int64_t n = rows * cols * tp;
  if (n == 0) return;
  unsigned blocks = unsigned(std::min<int64_t>((n + 255) / 256, 2048));
  rank_blocks_to_last_dim_kernel<<<blocks, 256, 0, stream>>>(in, out, rows, cols, tp);
  PUNICA_CUDA_CHECK_LAUNCH();
}
}  // namespace punica::kernels
