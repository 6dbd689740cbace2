// StreamHold (see stream_hold.h).
#include "kernels/common/stream_hold.h"
#include "kernels/common/cuda_check.h"

namespace punica::kernels {
namespace {
__device__ __forceinline__ uint64_t global_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %globaltimer;" : "=l"(t));
  return t;
}
// Spins until words[0] reaches `epoch` (wrap-safe compare) or `timeout_ns` passed; then sets words[1].
__global__ void stream_hold_kernel(volatile uint32_t* words, uint32_t epoch, uint64_t timeout_ns) {
  const uint64_t t0 = global_ns();
  while (int32_t(words[0] - epoch) < 0) {
    if (global_ns() - t0 > timeout_ns) {
      words[1] = 1u;
      return;
    }
    __nanosleep(2000);
  }
}
}  // namespace

StreamHold::StreamHold() {
  void* h = nullptr;
  PUNICA_CUDA_CHECK(cudaHostAlloc(&h, 64, cudaHostAllocMapped | cudaHostAllocPortable));
  host_ = static_cast<volatile uint32_t*>(h);
  host_[0] = 0;
  host_[1] = 0;
  void* d = nullptr;
  const cudaError_t e = cudaHostGetDevicePointer(&d, h, 0);
  if (e != cudaSuccess) {
    cudaFreeHost(h);
    PUNICA_CUDA_CHECK(e);
  }
  dev_ = static_cast<uint32_t*>(d);
}

StreamHold::~StreamHold() {
  if (host_) cudaFreeHost(const_cast<uint32_t*>(host_));  // no throw from a destructor
}

void StreamHold::hold(cudaStream_t stream, double timeout_s) {
  ++epoch_;
  const double ns = timeout_s > 0 ? timeout_s * 1e9 : 0.0;
  stream_hold_kernel<<<1, 1, 0, stream>>>(dev_, epoch_, uint64_t(ns));
  PUNICA_CUDA_CHECK_LAUNCH();
}

void StreamHold::release() { __atomic_store_n(const_cast<uint32_t*>(host_), epoch_, __ATOMIC_RELEASE); }

bool StreamHold::timed_out() const { return __atomic_load_n(const_cast<uint32_t*>(host_ + 1), __ATOMIC_ACQUIRE) != 0; }

void StreamHold::clear_timeout() { __atomic_store_n(const_cast<uint32_t*>(host_ + 1), 0u, __ATOMIC_RELEASE); }

}  // namespace punica::kernels
