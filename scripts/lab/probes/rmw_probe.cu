// Probe (not part of the suite's build): what the prefill expand's y read-modify-write costs on this
// GPU without its math, timed the way punica-bench times an op (cold: events around one call over
// rotated buffers, > 2x L2 in all, median of 30; graph: one CUDA graph of 32 calls, per call).
// y is bf16 [rows x cols]; the touched rows are a sorted list (the tokens with an adapter).
// Patterns, each adding 1 to every touched element (or copying, for the comparison):
//   copy        contiguous src -> dst of the touched bytes (what copy_gb_per_s measures)
//   rmw-linear  the same bytes in place, contiguous
//   rmw-rows    gathered rows, grid-stride over (row, 16-byte chunk), 4 chunks in flight per thread
//   rmw-tile    a block = 64 rows x 128 columns through registers (4 chunks per thread)
//   rmw-tileN   a block = 64 rows x N column tiles, the next tile's loads issued before the stores
//   rmw-smem    a block = 64 rows x 4 column tiles staged by cp.async through a 2-stage ring in
//               shared memory (the pipelined expand's memory structure, no mma)
// Build: nvcc -O3 -arch=sm_90a -o rmw_probe scripts/lab/probes/rmw_probe.cu
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <vector>
#include "probe_timing.cuh"

__device__ __forceinline__ uint4 inc(uint4 v) {
  uint32_t* w = reinterpret_cast<uint32_t*>(&v);
  const __nv_bfloat162 one = __floats2bfloat162_rn(1.f, 1.f);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    __nv_bfloat162 h = *reinterpret_cast<__nv_bfloat162*>(&w[i]);
    h = __hadd2(h, one);
    w[i] = *reinterpret_cast<uint32_t*>(&h);
  }
  return v;
}

__global__ void __launch_bounds__(256) copy_linear(const uint4* __restrict__ s, uint4* __restrict__ d, size_t n16) {
  const size_t stride = size_t(gridDim.x) * blockDim.x;
  size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  for (; i + 3 * stride < n16; i += 4 * stride) {
    uint4 v[4];
#pragma unroll
    for (int u = 0; u < 4; ++u) v[u] = __ldg(s + i + u * stride);
#pragma unroll
    for (int u = 0; u < 4; ++u) d[i + u * stride] = v[u];
  }
  for (; i < n16; i += stride) d[i] = __ldg(s + i);
}

__global__ void __launch_bounds__(256) rmw_linear(uint4* y, size_t n16) {
  const size_t stride = size_t(gridDim.x) * blockDim.x;
  size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  for (; i + 3 * stride < n16; i += 4 * stride) {
    uint4 v[4];
#pragma unroll
    for (int u = 0; u < 4; ++u) v[u] = y[i + u * stride];
#pragma unroll
    for (int u = 0; u < 4; ++u) y[i + u * stride] = inc(v[u]);
  }
  for (; i < n16; i += stride) y[i] = inc(y[i]);
}

// (touched row, chunk) flattened; cpr = 16-byte chunks per row
__global__ void __launch_bounds__(256) rmw_rows(uint4* y, const int* rows, int nrows, int cpr) {
  const size_t n = size_t(nrows) * cpr, stride = size_t(gridDim.x) * blockDim.x;
  size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  for (; i < n; i += 4 * stride) {
    uint4 v[4];
    size_t a[4];
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      const size_t k = i + u * stride;
      a[u] = k < n ? size_t(rows[k / cpr]) * cpr + k % cpr : ~size_t(0);
      if (a[u] != ~size_t(0)) v[u] = y[a[u]];
    }
#pragma unroll
    for (int u = 0; u < 4; ++u)
      if (a[u] != ~size_t(0)) y[a[u]] = inc(v[u]);
  }
}

// The 4 rows a thread owns in block row tile blockIdx.y (64 rows, 16 threads per row: rows
// threadIdx.x / 16 + 16k) as 16-byte-chunk offsets, ~0 past the last touched row.
__device__ __forceinline__ void row_offsets(size_t (&off)[4], const int* rows, int nrows, int cpr) {
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const int r = int(blockIdx.y) * 64 + int(threadIdx.x >> 4) + 16 * k;
    off[k] = r < nrows ? size_t(rows[r]) * cpr : ~size_t(0);
  }
}

// block (column group of NTB tiles, 64-row tile); 16 threads per row of a 128-column tile
template <int NTB>
__global__ void __launch_bounds__(256) rmw_tile(uint4* y, const int* rows, int nrows, int cpr) {
  const int c16 = threadIdx.x & 15;
  size_t off[4];
  row_offsets(off, rows, nrows, cpr);
  const int cbase = blockIdx.x * NTB * 16 + c16;
  uint4 cur[4], nxt[4];
#pragma unroll
  for (int k = 0; k < 4; ++k)
    if (off[k] != ~size_t(0) && cbase < cpr) cur[k] = y[off[k] + cbase];
#pragma unroll
  for (int j = 0; j < NTB; ++j) {
    const int c = cbase + j * 16, cn = c + 16;
    if (j + 1 < NTB) {
#pragma unroll
      for (int k = 0; k < 4; ++k)
        if (off[k] != ~size_t(0) && cn < cpr) nxt[k] = y[off[k] + cn];
    }
#pragma unroll
    for (int k = 0; k < 4; ++k)
      if (off[k] != ~size_t(0) && c < cpr) y[off[k] + c] = inc(cur[k]);
#pragma unroll
    for (int k = 0; k < 4; ++k) cur[k] = nxt[k];
  }
}

__device__ __forceinline__ void cp16(void* dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(static_cast<uint32_t>(__cvta_generic_to_shared(dst))),
               "l"(src)
               : "memory");
}
// 64 rows x NTB tiles of 128 columns, 2-stage cp.async ring (16 KB per stage), barrier per tile
template <int NTB>
__global__ void __launch_bounds__(256, 4) rmw_smem(uint4* y, const int* rows, int nrows, int cpr) {
  __shared__ uint4 sm[2][64 * 16];
  const int c16 = threadIdx.x & 15, rr = threadIdx.x >> 4;
  size_t off[4];
  row_offsets(off, rows, nrows, cpr);
  const int cbase = blockIdx.x * NTB * 16 + c16;
  auto issue = [&](int j) {
    const int c = cbase + j * 16;
#pragma unroll
    for (int k = 0; k < 4; ++k)
      if (off[k] != ~size_t(0) && c < cpr) cp16(&sm[j & 1][(rr + 16 * k) * 16 + c16], y + off[k] + c);
    asm volatile("cp.async.commit_group;\n" ::: "memory");
  };
  issue(0);
  for (int j = 0; j < NTB; ++j) {
    if (j + 1 < NTB) issue(j + 1);
    else asm volatile("cp.async.commit_group;\n" ::: "memory");
    asm volatile("cp.async.wait_group 1;\n" ::: "memory");
    __syncthreads();
    const int c = cbase + j * 16;
#pragma unroll
    for (int k = 0; k < 4; ++k)
      if (off[k] != ~size_t(0) && c < cpr) y[off[k] + c] = inc(sm[j & 1][(rr + 16 * k) * 16 + c16]);
    __syncthreads();
  }
}

int main() {
  cudaStream_t st;
  CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  int sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  const size_t pool = size_t(1) << 30;
  char* buf;
  CK(cudaMalloc(&buf, pool));
  CK(cudaMemset(buf, 0x3c, pool));
  struct Shape { const char* name; int rows, cols, touched; };
  // the Llama-3-8B qkv layer's y per rank at tp 2 and tp 1 (8192 tokens, a quarter without an
  // adapter), and the bench's qkv T=8192 (every token with one)
  const Shape shapes[] = {{"qkv-tp2", 8192, 3072, 6144}, {"qkv-tp1", 8192, 6144, 6144}, {"bench-qkv", 8192, 6144, 8192}};
  for (const Shape& sh : shapes) {
    const size_t ybytes = size_t(sh.rows) * sh.cols * 2;
    const int copies = int(std::min<size_t>(pool / ybytes, 8));
    const int cpr = sh.cols / 8;
    // touched rows: the first 3/4 of each 2048-row request, as the layer's no-adapter request
    std::vector<int> rows;
    for (int r = 0; r < sh.rows && int(rows.size()) < sh.touched; ++r) rows.push_back(r);
    int* drows;
    CK(cudaMalloc(&drows, rows.size() * 4));
    CK(cudaMemcpy(drows, rows.data(), rows.size() * 4, cudaMemcpyHostToDevice));
    const int nrows = int(rows.size());
    const double bytes = 2.0 * nrows * double(sh.cols) * 2;  // read + written
    const size_t n16 = size_t(nrows) * cpr;
    auto Y = [&](int i) { return reinterpret_cast<uint4*>(buf + size_t(i % copies) * ybytes); };
    char name[96];
    for (int bps : {4, 8}) {
      std::snprintf(name, sizeof name, "%s copy %d/SM", sh.name, bps);
      time_it(name, bytes, [&](int i, cudaStream_t s) {
        const int c2 = copies / 2;
        copy_linear<<<sms * bps, 256, 0, s>>>(Y(i % c2), Y(c2 + i % c2), n16);
      }, st);
      std::snprintf(name, sizeof name, "%s rmw-linear %d/SM", sh.name, bps);
      time_it(name, bytes, [&](int i, cudaStream_t s) { rmw_linear<<<sms * bps, 256, 0, s>>>(Y(i), n16); }, st);
      std::snprintf(name, sizeof name, "%s rmw-rows %d/SM", sh.name, bps);
      time_it(name, bytes, [&](int i, cudaStream_t s) { rmw_rows<<<sms * bps, 256, 0, s>>>(Y(i), drows, nrows, cpr); }, st);
    }
    const int rt = (nrows + 63) / 64, ct = (cpr + 15) / 16;
    auto tile = [&](const char* what, auto kern, int ntb) {
      std::snprintf(name, sizeof name, "%s %s ntb%d", sh.name, what, ntb);
      time_it(name, bytes, [&](int i, cudaStream_t s) {
        kern<<<dim3((ct + ntb - 1) / ntb, rt), 256, 0, s>>>(Y(i), drows, nrows, cpr);
      }, st);
    };
    tile("rmw-tile", rmw_tile<1>, 1);
    tile("rmw-tile", rmw_tile<2>, 2);
    tile("rmw-tile", rmw_tile<4>, 4);
    tile("rmw-smem", rmw_smem<3>, 3);
    tile("rmw-smem", rmw_smem<4>, 4);
    tile("rmw-smem", rmw_smem<8>, 8);
    CK(cudaFree(drows));
  }
  CK(cudaDeviceSynchronize());
  return 0;
}
