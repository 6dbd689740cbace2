// A CPU stand-in for the CUDA execution model, to run simple kernels where no GPU is at hand:
// blocks one after another, each thread of a block a fiber (ucontext) of one OS thread;
// __syncthreads and the warp shuffles are real barriers (a missing one shows as wrong results,
// a divergent one as a reported deadlock); shared memory = the kernel's function statics (one
// block runs at a time), dynamic shared memory one poisoned buffer. emulate_kernel.py rewrites a
// .cu to use it. Not a model of timing, memory ordering between blocks, or warp-synchronous code.
#pragma once
#include <ucontext.h>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <cmath>
#include <functional>
#include <vector>
#include <algorithm>
#include <cuda_runtime_api.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#define PUNICA_BLOCK_EMU 1
namespace emu {
struct Dim { unsigned x = 1, y = 1, z = 1; };
enum St { READY, WAIT_BLOCK, WAIT_WARP, DONE };
struct Fiber { ucontext_t ctx; std::vector<char> stack; Dim tid; int lin; St st; };
inline Dim g_block, g_grid, g_bdim;
inline std::vector<Fiber> fibers;
inline int cur = 0;
inline ucontext_t sched;
inline std::vector<char> dsmem(1 << 20);
inline float shfl_buf[32][32];
inline std::function<void()> body;
inline long long switches = 0;
inline void yield_to_sched() { ++switches; swapcontext(&fibers[cur].ctx, &sched); }
inline void syncthreads() { fibers[cur].st = WAIT_BLOCK; yield_to_sched(); }
inline void syncwarp() { fibers[cur].st = WAIT_WARP; yield_to_sched(); }
inline void entry() { body(); fibers[cur].st = DONE; }
template <class T> T* dyn_smem() { return reinterpret_cast<T*>(dsmem.data()); }
template <class T> T shfl_xor(unsigned, T v, int o) {
  const int lin = fibers[cur].lin, w = lin / 32, l = lin % 32;
  std::memcpy(&shfl_buf[w][l], &v, sizeof(float));
  syncwarp();
  T r;
  std::memcpy(&r, &shfl_buf[w][l ^ o], sizeof(float));
  syncwarp();
  return r;
}
template <class K, class P>
void launch(K kernel, dim3 grid, unsigned threads, size_t smem, const P& p) {
  if (smem > dsmem.size()) { std::fprintf(stderr, "smem too big\n"); std::abort(); }
  g_grid = {grid.x, grid.y, grid.z};
  g_bdim = {threads, 1, 1};
  fibers.resize(threads);
  for (auto& f : fibers) if (f.stack.empty()) f.stack.resize(256 * 1024);
  for (unsigned bz = 0; bz < grid.z; ++bz)
    for (unsigned by = 0; by < grid.y; ++by)
      for (unsigned bx = 0; bx < grid.x; ++bx) {
        g_block = {bx, by, bz};
        // poison shared memory per block
        std::memset(dsmem.data(), 0xff, smem);
        body = [&] { kernel(p); };
        for (unsigned t = 0; t < threads; ++t) {
          Fiber& f = fibers[t];
          f.tid = {t, 0, 0};
          f.lin = int(t);
          f.st = READY;
          getcontext(&f.ctx);
          f.ctx.uc_stack.ss_sp = f.stack.data();
          f.ctx.uc_stack.ss_size = f.stack.size();
          f.ctx.uc_link = &sched;
          makecontext(&f.ctx, entry, 0);
        }
        for (;;) {
          bool ran = false;
          for (unsigned t = 0; t < threads; ++t)
            if (fibers[t].st == READY) { cur = int(t); ran = true; swapcontext(&sched, &fibers[t].ctx); }
          int live = 0, wb = 0;
          for (auto& f : fibers) { live += f.st != DONE; wb += f.st == WAIT_BLOCK; }
          if (live == 0) break;
          bool released = false;
          if (wb == live) { for (auto& f : fibers) if (f.st == WAIT_BLOCK) f.st = READY; released = true; }
          else if (wb > 0 && live < int(threads)) {
            // CUDA counts exited threads as arrived (sm_70+); emulate that: release when all live wait
          }
          for (unsigned w = 0; w * 32 < threads; ++w) {
            int lv = 0, ww = 0;
            for (unsigned l = 0; l < 32; ++l) { auto& f = fibers[w * 32 + l]; lv += f.st != DONE; ww += f.st == WAIT_WARP; }
            if (lv > 0 && ww == lv) { for (unsigned l = 0; l < 32; ++l) if (fibers[w * 32 + l].st == WAIT_WARP) fibers[w * 32 + l].st = READY; released = true; }
            if (ww > 0 && ww < 32) { std::fprintf(stderr, "partial warp at shfl (block %u %u %u warp %u)\n", bx, by, bz, w); std::abort(); }
          }
          if (!released && !ran) { std::fprintf(stderr, "deadlock in block %u %u %u\n", bx, by, bz); std::abort(); }
          if (!released) {
            bool any = false; for (auto& f : fibers) any = any || f.st == READY;
            if (!any) { std::fprintf(stderr, "deadlock(2) in block %u %u %u\n", bx, by, bz); std::abort(); }
          }
        }
      }
}
// mma.sync m16n8k16 (row.col, fp32 accumulate) of one warp: every lane posts its fragments, then
// computes its own four outputs from the whole 16x16 A and 16x8 B (PTX ISA fragment layouts). All 32
// lanes must call it, as on the GPU (a partial warp aborts).
inline uint32_t mma_a[32][32][4], mma_b[32][32][2];
template <class T> float mma_el(uint32_t v, int hi) {
  T h[2];
  std::memcpy(h, &v, 4);
  return float(h[hi]);
}
template <class T> void mma16816(float c[4], const uint32_t a[4], const uint32_t b[2]) {
  const int lin = fibers[cur].lin, w = lin / 32, l = lin % 32;
  std::memcpy(mma_a[w][l], a, 16);
  std::memcpy(mma_b[w][l], b, 8);
  syncwarp();
  auto A = [&](int r, int k) { return mma_el<T>(mma_a[w][(r % 8) * 4 + (k % 8) / 2][r / 8 + 2 * (k / 8)], k % 2); };
  auto B = [&](int k, int n) { return mma_el<T>(mma_b[w][n * 4 + (k % 8) / 2][k / 8], k % 2); };
  const int g = l / 4, t = l % 4;
  float out[4];
  for (int i = 0; i < 4; ++i) {
    const int row = g + 8 * (i / 2), col = 2 * t + i % 2;
    float s = 0.f;
    for (int k = 0; k < 16; ++k) s += A(row, k) * B(k, col);
    out[i] = c[i] + s;
  }
  syncwarp();
  for (int i = 0; i < 4; ++i) c[i] = out[i];
}
}  // namespace emu
// cuda_runtime.h's launch with attributes (PDL): the blocks run one after another anyway.
template <class K, class P>
cudaError_t cudaLaunchKernelEx(const cudaLaunchConfig_t* c, K kernel, const P& p) {
  ::emu::launch(kernel, c->gridDim, c->blockDim.x, c->dynamicSmemBytes, p);
  return cudaSuccess;
}
namespace emu {
inline cudaError_t memset_async(void* p, int v, size_t n, cudaStream_t) { std::memset(p, v, n); return cudaSuccess; }
template <class F> cudaError_t func_set_attr(F, cudaFuncAttribute, int) { return cudaSuccess; }
}  // namespace emu
#define threadIdx (::emu::fibers[::emu::cur].tid)
#define blockIdx (::emu::g_block)
#define blockDim (::emu::g_bdim)
#define gridDim (::emu::g_grid)
#define __syncthreads() ::emu::syncthreads()
#define __shfl_xor_sync(m, v, o) ::emu::shfl_xor((m), (v), (o))
template <class T> inline T __ldg(const T* p) {  // a vector load must be aligned to its size on the GPU
  if (reinterpret_cast<uintptr_t>(p) % sizeof(T)) { std::fprintf(stderr, "misaligned %zu-byte load\n", sizeof(T)); std::abort(); }
  return *p;
}
template <class T> inline void __stwb(T* p, T v) {  // a vector store must be aligned to its size on the GPU
  if (reinterpret_cast<uintptr_t>(p) % sizeof(T)) { std::fprintf(stderr, "misaligned %zu-byte store\n", sizeof(T)); std::abort(); }
  *p = v;
}
inline int __ffs(int x) { return __builtin_ffs(x); }
inline int atomicAdd(int* p, int v) { int o = *p; *p += v; return o; }
inline float atomicAdd(float* p, float v) { float o = *p; *p += v; return o; }
inline float4 atomicAdd(float4* p, float4 v) {
  if (reinterpret_cast<uintptr_t>(p) % 16) { std::fprintf(stderr, "misaligned float4 atomic\n"); std::abort(); }
  float4 o = *p; p->x += v.x; p->y += v.y; p->z += v.z; p->w += v.w; return o;
}
using std::min;
using std::max;
namespace cub {
template <class T, int N> struct BlockScan {
  struct TempStorage { T v[N]; };
  TempStorage& s;
  explicit BlockScan(TempStorage& t) : s(t) {}
  void ExclusiveSum(T in, T& out, T& agg) {
    s.v[threadIdx.x] = in;
    __syncthreads();
    T acc = 0, tot = 0;
    for (int i = 0; i < N; ++i) { if (i < int(threadIdx.x)) acc += s.v[i]; tot += s.v[i]; }
    out = acc; agg = tot;
    __syncthreads();
  }
};
}
