// Row gather/scatter, act_and_mul and moe_sum of the base MoE pipeline (moe_base.h): grid-stride
// element loops, fp32 math, one rounding to the output dtype per element.
#include "kernels/moe_base/moe_base.h"
#include <algorithm>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include "kernels/common/cuda_check.h"
#include "kernels/common/error.h"
#include "kernels/add_lora_embedding/lora_elem.cuh"

namespace punica::kernels {
namespace {

using elem::from_f;
using elem::to_f;

// Runs f(T{}) with T the storage type of dt.
template <class F>
void by_dtype(DType dt, F&& f) {
  switch (dt) {
    case DType::f32: f(float{}); break;
    case DType::f16: f(__half{}); break;
    case DType::bf16: f(__nv_bfloat16{}); break;
  }
}

template <class T>
__global__ void gather_rows_kernel(T* dst, const T* src, const int32_t* idx, const float* scale, int64_t rows,
                                   int64_t cols, int64_t ld_dst, int64_t ld_src) {
  const int64_t n = rows * cols;
  for (int64_t o = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; o < n; o += int64_t(gridDim.x) * blockDim.x) {
    const int64_t i = o / cols, c = o % cols;
    const int64_t s = idx[i];
    float v = 0.f;
    if (s >= 0) {
      v = to_f(src[s * ld_src + c]);
      if (scale) v *= scale[i];
    }
    dst[i * ld_dst + c] = from_f<T>(v);
  }
}

template <class T>
__global__ void activation_kernel(T* out, const T* in, int64_t rows, int64_t inter, int act) {
  const int64_t n = rows * inter;
  const int64_t ld_in = act == 2 ? inter : 2 * inter;
  for (int64_t o = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; o < n; o += int64_t(gridDim.x) * blockDim.x) {
    const int64_t i = o / inter, c = o % inter;
    const T* r = in + i * ld_in;
    float g, u = 1.f;
    if (act == 0) { g = to_f(r[c]); u = to_f(r[inter + c]); }
    else if (act == 1) { g = to_f(r[2 * c]); u = to_f(r[2 * c + 1]); }
    else g = to_f(r[c]);
    const float s = g / (1.f + expf(-g));
    out[o] = from_f<T>(s * u);
  }
}

template <class T>
__global__ void moe_sum_kernel(T* out, const T* in, int64_t tokens, int top_k, int64_t cols) {
  const int64_t n = tokens * cols;
  for (int64_t o = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; o < n; o += int64_t(gridDim.x) * blockDim.x) {
    const int64_t m = o / cols, c = o % cols;
    float acc = 0.f;
    for (int j = 0; j < top_k; ++j) acc += to_f(in[(m * top_k + j) * cols + c]);
    out[o] = from_f<T>(acc);
  }
}

__global__ void write_pointers_kernel(void** table, MoePtrPack pack) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < pack.n) table[i] = const_cast<void*>(pack.p[i]);
}

unsigned blocks_for(int64_t n) { return unsigned(std::min<int64_t>((n + 255) / 256, 65535)); }

}  // namespace

void launch_moe_gather_rows(void* dst, const void* src, const int32_t* idx, const float* scale, DType dtype,
                            int64_t rows, int64_t cols, int64_t ld_dst, int64_t ld_src, cudaStream_t stream) {
  if (rows <= 0 || cols <= 0) return;
  PUNICA_REQUIRE(dst && src && idx && ld_dst >= cols && ld_src >= cols, ErrorKind::usage,
                 "launch_moe_gather_rows: null pointer or row stride below cols");
  const unsigned b = blocks_for(rows * cols);
  by_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    gather_rows_kernel<T><<<b, 256, 0, stream>>>(static_cast<T*>(dst), static_cast<const T*>(src), idx, scale, rows,
                                                 cols, ld_dst, ld_src);
  });
  PUNICA_CUDA_CHECK_LAUNCH();
}

void launch_moe_activation(void* out, const void* in, DType dtype, int64_t rows, int64_t inter, MoeAct act,
                           cudaStream_t stream) {
  if (rows <= 0 || inter <= 0) return;
  PUNICA_REQUIRE(out && in, ErrorKind::usage, "launch_moe_activation: null pointer");
  const unsigned b = blocks_for(rows * inter);
  const int a = int(act);
  by_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    activation_kernel<T><<<b, 256, 0, stream>>>(static_cast<T*>(out), static_cast<const T*>(in), rows, inter, a);
  });
  PUNICA_CUDA_CHECK_LAUNCH();
}

void launch_moe_sum(void* out, const void* in, DType dtype, int64_t tokens, int top_k, int64_t cols,
                    cudaStream_t stream) {
  if (tokens <= 0 || cols <= 0) return;
  PUNICA_REQUIRE(out && in && top_k >= 1, ErrorKind::usage, "launch_moe_sum: null pointer or top_k < 1");
  const unsigned b = blocks_for(tokens * cols);
  by_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    moe_sum_kernel<T><<<b, 256, 0, stream>>>(static_cast<T*>(out), static_cast<const T*>(in), tokens, top_k, cols);
  });
  PUNICA_CUDA_CHECK_LAUNCH();
}

void launch_moe_write_pointers(void** table, const MoePtrPack& pack, cudaStream_t stream) {
  if (pack.n <= 0) return;
  PUNICA_REQUIRE(table && pack.n <= kMoePtrPackMax, ErrorKind::usage, "launch_moe_write_pointers: bad table or count");
  write_pointers_kernel<<<(pack.n + 127) / 128, 128, 0, stream>>>(table, pack);
  PUNICA_CUDA_CHECK_LAUNCH();
}

}  // namespace punica::kernels
