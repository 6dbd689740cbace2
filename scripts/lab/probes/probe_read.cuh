// The probes' reference read (not part of the suite's build): a grid-stride read of n16 16-byte chunks,
// 4 loads in flight per thread, the values folded so that the loads are kept. Included by
// stream_probe.cu and ws_ring_probe.cu, each built alone with nvcc.
#pragma once
#include <cuda_runtime.h>
#include <cstddef>
#include <cstdint>

__global__ void __launch_bounds__(256) read_linear(const uint4* __restrict__ p, size_t n16, float* out) {
  const size_t stride = size_t(gridDim.x) * blockDim.x;
  uint32_t acc = 0;
  size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  for (; i + 3 * stride < n16; i += 4 * stride) {
    uint4 v[4];
#pragma unroll
    for (int u = 0; u < 4; ++u) v[u] = __ldg(p + i + u * stride);
#pragma unroll
    for (int u = 0; u < 4; ++u) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
  }
  for (; i < n16; i += stride) { uint4 v = __ldg(p + i); acc ^= v.x ^ v.y ^ v.z ^ v.w; }
  if (acc == 0x12345678u) out[0] = 1.f;  // keeps the loads
}
