// vLLM lora_shrink (add_shrink), cluster split-K tile for mid-sized batches (shrink_heur::
// cluster_config): y[s, t, j] = scale * A_s[l][j] . x[t] for j < r_l, 0 for j >= r_l and for tokens
// with slot -1. Written once per element by one kernel: no zero kernel, no atomics, deterministic.
//
// A CTA owns a tile of BM = 16 * MG tokens of one adapter (the sorted-token tiles, the -1 entry's
// included), NBW blocks of 8 rank columns over all slices (a column group) and 1 / C of K. Its
// warps take the CTA's 32-element k chunks in turn and load x and A straight into mma.sync
// m16n8k16 fragments: lane (g, q) reads the 16 bytes at k = 32c + 8q of token row g (and g + 8) and
// of rank row g of each column block, and uses their four 32-bit pairs as the fragment's k pairs
// {2q, 2q+8} of two k16 steps. That permutes k the same way in both operands, so each dot product
// still runs over all 32 elements: no shared-memory staging and no ldmatrix. The warps' partial
// tiles are summed in shared memory, then the C CTAs of the cluster (along K) read each other's
// sums through distributed shared memory, each finishing 1 / C of the tile's rows in rank order.
// Column blocks past the adapter's true rank are neither loaded nor multiplied; rows past it
// inside a block load zeros (A's padding, 0 or NaN, is never read).
#include <cooperative_groups.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <algorithm>
#include <atomic>
#include "kernels/common/cuda_check.h"
#include "kernels/common/error.h"
#include "kernels/lora_shrink/heuristics.h"
#include "kernels/lora_shrink/lora_device.cuh"
#include "kernels/lora_shrink/lora_shrink_internal.h"
#include "kernels/lora_shrink/shrink_params.h"

namespace punica::kernels {
namespace {
using namespace lora_dev;
namespace H = shrink_heur;
namespace cgrp = cooperative_groups;

constexpr int kW = H::kClThreads / 32;

struct ClusterParams : ShrinkCore {  // y: [S, T, R] fp32
  int nbs;  // blocks of 8 columns per slice: ceil(R / 8)
  int cpc;  // 32-element k chunks per CTA
  // 0: every CTA triggers its programmatic dependents at once. 1: a CTA with a tile triggers them
  // only after its griddepcontrol.wait (CTAs without a tile exit, which counts as a trigger), so the
  // dependent starts only once the kernel before this one has finished: add_lora_linear's expand,
  // which loads y before its own wait, may then follow a shrink that is itself a dependent.
  int late_trigger;
};

__device__ __forceinline__ uint4 ld16(const void* p) { return __ldg(static_cast<const uint4*>(p)); }

template <class T, int MG, int NBW>
__global__ void __launch_bounds__(H::kClThreads, 2) shrink_cluster_kernel(ClusterParams p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  constexpr int BM = 16 * MG, NC = NBW * 8;
  constexpr int kUnroll = MG == 1 ? 4 : 2;  // chunks per warp in flight (registers: MG * 2 + NBW 16-byte loads each)
  __shared__ __align__(16) float part[kW][BM * NC];
  if (!p.late_trigger) pdl_launch_dependents();
  // Before griddepcontrol.wait: only the metadata and the ranks (as every lora_shrink kernel).
  TileRef tr;
  // blockIdx.z is the same for every CTA of a cluster: they all return here, or none does. With
  // late_trigger a returning CTA needs no wait: a launch with tokens has at least one tile (the -1
  // tile included), and its CTAs wait before they trigger.
  if (!find_tile(p.meta, p.L + 1, BM, int(blockIdx.z), tr, true)) return;
  cgrp::cluster_group cluster = cgrp::this_cluster();
  const int crank = int(cluster.block_rank());
  const int C = int(cluster.num_blocks());
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, q = lane & 3;
  const int l = tr.slot, nrows = tr.rows(BM), first = tr.first(BM);
  const int r = l >= 0 ? min(p.ranks[l], p.R) : 0;
  const int nblk = p.S * p.nbs;  // column blocks of the launch
  const int gb0 = int(blockIdx.y) * NBW;
  const int rpc = (BM + C - 1) / C;  // rows this CTA finishes
  float* Y = static_cast<float*>(p.y);

  if (r == 0) {  // a -1 tile or a rank-0 adapter: zeros, uniform over the cluster (no exchange)
    pdl_wait();
    if (p.late_trigger) pdl_launch_dependents();
    for (int e = tid; e < rpc * NC; e += H::kClThreads) {
      const int row = crank * rpc + e / NC, col = e % NC, gb = gb0 + col / 8;
      if (row >= nrows || gb >= nblk) continue;
      const int s = gb / p.nbs, j = (gb % p.nbs) * 8 + (col & 7);
      if (j >= p.R) continue;
      const int t = p.meta.sorted_token_ids[first + row];
      Y[(int64_t(s) * p.T + t) * p.R + j] = 0.f;
    }
    return;
  }

  int tok[MG][2];
#pragma unroll
  for (int mg = 0; mg < MG; ++mg)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = mg * 16 + h * 8 + g;
      tok[mg][h] = row < nrows ? p.meta.sorted_token_ids[first + row] : -1;
    }
  // This lane's rank row in each column block (row g of the block), null past the true rank.
  const T* arow[NBW];
  bool act[NBW];
#pragma unroll
  for (int nb = 0; nb < NBW; ++nb) {
    const int gb = gb0 + nb;
    const int s = gb < nblk ? gb / p.nbs : 0;
    const int jb = gb < nblk ? gb % p.nbs : 0;
    act[nb] = gb < nblk && jb * 8 < r;  // warp-uniform
    const int j = jb * 8 + g;
    arow[nb] = act[nb] && j < r ? static_cast<const T*>(p.a[s]) + (int64_t(l) * p.R + j) * p.K : nullptr;
  }
  pdl_wait();  // x may be written, and y read, by the previous kernel on the stream
  if (p.late_trigger) pdl_launch_dependents();

  float acc[MG][NBW][4] = {};

  const T* X = static_cast<const T*>(p.x);
  const int nch = int((p.K + 31) / 32);
  const int c0 = crank * p.cpc, c1 = min(nch, c0 + p.cpc);
  const uint4 z4 = make_uint4(0u, 0u, 0u, 0u);
#pragma unroll 1
  for (int c = c0 + warp; c < c1; c += kW * kUnroll) {
    uint4 xv[kUnroll][MG][2], av[kUnroll][NBW];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int cc = c + u * kW;
      const int64_t k = int64_t(cc) * 32 + 8 * q;
      const bool kin = cc < c1 && k < p.K;  // K % 8 == 0: a lane's 8 elements are all in or all out
#pragma unroll
      for (int mg = 0; mg < MG; ++mg)
#pragma unroll
        for (int h = 0; h < 2; ++h)
          xv[u][mg][h] = kin && tok[mg][h] >= 0 ? ld16(X + int64_t(tok[mg][h]) * p.x_stride + k) : z4;
#pragma unroll
      for (int nb = 0; nb < NBW; ++nb) av[u][nb] = kin && arow[nb] != nullptr ? ld16(arow[nb] + k) : z4;
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u)
#pragma unroll
      for (int nb = 0; nb < NBW; ++nb) {
        if (!act[nb]) continue;
#pragma unroll
        for (int mg = 0; mg < MG; ++mg) {
          const uint32_t a0[4] = {xv[u][mg][0].x, xv[u][mg][1].x, xv[u][mg][0].y, xv[u][mg][1].y};
          MmaOp<T>::run(acc[mg][nb], a0, av[u][nb].x, av[u][nb].y);
          const uint32_t a1[4] = {xv[u][mg][0].z, xv[u][mg][1].z, xv[u][mg][0].w, xv[u][mg][1].w};
          MmaOp<T>::run(acc[mg][nb], a1, av[u][nb].z, av[u][nb].w);
        }
      }
  }

  // The warps' partial tiles (C fragment: rows g / g + 8, columns 2q, 2q + 1), summed into part[0].
#pragma unroll
  for (int mg = 0; mg < MG; ++mg)
#pragma unroll
    for (int nb = 0; nb < NBW; ++nb) {
      const int row = mg * 16 + g, col = nb * 8 + 2 * q;
      *reinterpret_cast<float2*>(&part[warp][row * NC + col]) = make_float2(acc[mg][nb][0], acc[mg][nb][1]);
      *reinterpret_cast<float2*>(&part[warp][(row + 8) * NC + col]) = make_float2(acc[mg][nb][2], acc[mg][nb][3]);
    }
  __syncthreads();
  for (int e = tid; e < BM * NC; e += H::kClThreads) {
    float v = part[0][e];
#pragma unroll
    for (int w = 1; w < kW; ++w) v += part[w][e];
    part[0][e] = v;
  }
  cluster.sync();  // every CTA's sum is complete and visible to the cluster
  for (int e = tid; e < rpc * NC; e += H::kClThreads) {
    const int row = crank * rpc + e / NC, col = e % NC, gb = gb0 + col / 8;
    if (row >= nrows || gb >= nblk) continue;
    const int s = gb / p.nbs, j = (gb % p.nbs) * 8 + (col & 7);
    if (j >= p.R) continue;
    float v = 0.f;
    for (int cr = 0; cr < C; ++cr) v += cluster.map_shared_rank(&part[0][0], cr)[row * NC + col];
    const int t = p.meta.sorted_token_ids[first + row];
    Y[(int64_t(s) * p.T + t) * p.R + j] = j < r ? v * p.scale : 0.f;
  }
  cluster.sync();  // no CTA leaves while another still reads its shared memory
#else
  __trap();  // sm_90 only: the host takes this tile only where cluster_available()
#endif
}

template <class T, int MG, int NBW>
void launch_cfg(const ClusterParams& p, const H::ClusterConfig& c, cudaStream_t st) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(unsigned(c.cluster), unsigned(c.ncg), unsigned(c.tiles));
  cfg.blockDim = dim3(H::kClThreads);
  cfg.dynamicSmemBytes = 0;
  cfg.stream = st;
  cudaLaunchAttribute attr[2];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = unsigned(c.cluster);
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  attr[1].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[1].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 2;
  PUNICA_CUDA_CHECK(cudaLaunchKernelEx(&cfg, shrink_cluster_kernel<T, MG, NBW>, p));
}

template <class T, int MG>
void launch_mg(const ClusterParams& p, const H::ClusterConfig& c, cudaStream_t st) {
  switch (c.nbw) {
    case 2: return launch_cfg<T, MG, 2>(p, c, st);
    case 4: return launch_cfg<T, MG, 4>(p, c, st);
    case 6: return launch_cfg<T, MG, 6>(p, c, st);
    default: return launch_cfg<T, MG, 8>(p, c, st);
  }
}

template <class T>
void launch_t(const ClusterParams& p, const H::ClusterConfig& c, cudaStream_t st) {
  if (c.mg == 1) launch_mg<T, 1>(p, c, st);
  else launch_mg<T, 2>(p, c, st);
}

}  // namespace

namespace detail {

bool cluster_available() {
  if (const PlanningDevice* o = planning_device_override()) return o->cluster;
  static std::atomic<int> cache[64];  // per device: 0 unknown, 1 yes, 2 no
  return lora_dev::per_device_cached(cache, [](int dev) {
           int v = 0;
           if (dev < 0 || cudaDeviceGetAttribute(&v, cudaDevAttrClusterLaunch, dev) != cudaSuccess) {
             cudaGetLastError();
             return 2;
           }
           return v ? 1 : 2;
         }) == 1;
}

bool shrink_cluster_ok(const LoraShrinkArgs& a) {
  if (a.dtype == DType::f32 || a.out_dtype != DType::f32) return false;
  if (!H::cluster_fits(a.num_slices, a.max_rank) || !cluster_available()) return false;
  return shrink_vec_ok(a, shrink_core(a));
}

void launch_shrink_cluster(const LoraShrinkArgs& a, cudaStream_t stream, bool late_trigger) {
  launch_shrink_cluster(a,
                        H::cluster_config(a.num_tokens, a.hidden, a.num_slices, a.max_rank,
                                          planned_loras(a.max_loras, a.num_active_loras), num_sms_cached()),
                        stream, late_trigger);
}

void launch_shrink_cluster(const LoraShrinkArgs& a, const H::ClusterConfig& c, cudaStream_t stream,
                           bool late_trigger) {
  PUNICA_REQUIRE(shrink_cluster_ok(a), ErrorKind::runtime, "lora_shrink: the cluster tile does not take this shape");
  if (a.num_tokens == 0 || a.max_rank == 0) return;
  ClusterParams p{};
  static_cast<ShrinkCore&>(p) = shrink_core(a);
  p.nbs = (a.max_rank + 7) / 8;
  p.cpc = c.chunks_per_cta;
  p.late_trigger = late_trigger ? 1 : 0;
  PUNICA_REQUIRE(c.tiles <= 65535, ErrorKind::usage, "lora_shrink: too many tokens for the cluster tile");
  if (a.dtype == DType::bf16) launch_t<__nv_bfloat16>(p, c, stream);
  else launch_t<__half>(p, c, stream);
}

}  // namespace detail
}  // namespace punica::kernels
