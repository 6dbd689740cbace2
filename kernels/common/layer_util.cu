// Bias add and masked vocab-shard embedding lookup for the TP LoRA layers (see layer_util.h).
// Both are memory-bound element passes; grid-stride loops over the output.
#include "kernels/common/layer_util.h"
#include <algorithm>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include "kernels/common/cuda_check.h"
#include "kernels/common/error.h"

namespace punica::kernels {
namespace {

template <class T> __device__ __forceinline__ float to_f(T v);
template <> __device__ __forceinline__ float to_f<float>(float v) { return v; }
template <> __device__ __forceinline__ float to_f<__half>(__half v) { return __half2float(v); }
template <> __device__ __forceinline__ float to_f<__nv_bfloat16>(__nv_bfloat16 v) { return __bfloat162float(v); }
template <class T> __device__ __forceinline__ T from_f(float v);
template <> __device__ __forceinline__ float from_f<float>(float v) { return v; }
template <> __device__ __forceinline__ __half from_f<__half>(float v) { return __float2half_rn(v); }
template <> __device__ __forceinline__ __nv_bfloat16 from_f<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }

template <class T>
__global__ void add_bias_kernel(T* y, const T* bias, int64_t rows, int64_t cols, int64_t ldy) {
  const int64_t n = rows * cols;
  for (int64_t o = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; o < n; o += int64_t(gridDim.x) * blockDim.x) {
    int64_t i = o / cols, c = o % cols;
    T* p = y + i * ldy + c;
    *p = from_f<T>(to_f<T>(*p) + to_f<T>(bias[c]));
  }
}

// Element type agnostic: copies 16- or 32-bit words, zero outside the shard.
template <class W>
__global__ void embedding_lookup_kernel(W* y, const W* table, const int32_t* ids, int64_t T, int64_t dim,
                                        int64_t begin, int64_t end, int64_t ldy) {
  const int64_t n = T * dim;
  for (int64_t o = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; o < n; o += int64_t(gridDim.x) * blockDim.x) {
    int64_t t = o / dim, d = o % dim;
    int64_t id = ids[t];
    y[t * ldy + d] = (id >= begin && id < end) ? table[(id - begin) * dim + d] : W(0);
  }
}

unsigned blocks_for(int64_t n) { return unsigned(std::min<int64_t>((n + 255) / 256, 8192)); }

}  // namespace

void launch_add_bias(void* y, const void* bias, DType dtype, int64_t rows, int64_t cols, int64_t ldy,
                     cudaStream_t stream) {
  if (rows <= 0 || cols <= 0) return;
  unsigned b = blocks_for(rows * cols);
  switch (dtype) {
    case DType::f32:
      add_bias_kernel<float><<<b, 256, 0, stream>>>(static_cast<float*>(y), static_cast<const float*>(bias), rows, cols, ldy);
      break;
    case DType::f16:
      add_bias_kernel<__half><<<b, 256, 0, stream>>>(static_cast<__half*>(y), static_cast<const __half*>(bias), rows, cols, ldy);
      break;
    case DType::bf16:
      add_bias_kernel<__nv_bfloat16><<<b, 256, 0, stream>>>(static_cast<__nv_bfloat16*>(y),
                                                            static_cast<const __nv_bfloat16*>(bias), rows, cols, ldy);
      break;
  }
  PUNICA_CUDA_CHECK_LAUNCH();
}

void launch_embedding_lookup(void* y, const void* table, const int32_t* ids, DType dtype, int64_t num_tokens,
                             int64_t dim, int64_t vocab_begin, int64_t vocab_end, int64_t ldy,
                             cudaStream_t stream) {
  if (num_tokens <= 0 || dim <= 0) return;
  unsigned b = blocks_for(num_tokens * dim);
  if (dtype == DType::f32)
    embedding_lookup_kernel<uint32_t><<<b, 256, 0, stream>>>(static_cast<uint32_t*>(y), static_cast<const uint32_t*>(table),
                                                             ids, num_tokens, dim, vocab_begin, vocab_end, ldy);
  else
    embedding_lookup_kernel<uint16_t><<<b, 256, 0, stream>>>(static_cast<uint16_t*>(y), static_cast<const uint16_t*>(table),
                                                             ids, num_tokens, dim, vocab_begin, vocab_end, ldy);
  PUNICA_CUDA_CHECK_LAUNCH();
}

}  // namespace punica::kernels
