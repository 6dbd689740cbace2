// vLLM lora_expand (add_expand), decode path: y[t, c_s + n] (+)= round_w(B_s[l] @ round_w(x[s,t,:r_l]))[n].
// One kernel, no memset. A block owns a group of output columns of one slice for one token (few
// tokens per adapter: l read straight from token_lora_mapping) or for up to TB tokens of one adapter
// (tokens sorted by slot), so B is read once per token group and every block issues all its loads
// (B, x, old y) before any arithmetic: latency, not a serial token loop, bounds small batches.
// G lanes share one B row (16-byte loads, G from the padded rank), partial dots are summed with
// warp shuffles; x lives in registers, already rounded to the weight dtype as vLLM does.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <algorithm>
#include <atomic>
#include "kernels/common/cuda_check.h"
#include "kernels/common/error.h"
#include "kernels/lora_expand/expand_decode.h"
#include "kernels/lora_expand/expand_params.h"
#include "kernels/lora_expand/heuristics.h"
#include "kernels/lora_shrink/lora_device.cuh"
#include "kernels/lora_shrink/lora_shrink_internal.h"  // detail::num_sms_cached

namespace punica::kernels {
namespace {
using namespace lora_dev;
namespace H = expand_heur;

struct DecodeParams : ExpandCore {  // x: [S, T, R] of the in dtype
  int xdt;                     // 0 fp32, 1 fp16, 2 bf16
  int vecb;                    // B rows 16-byte aligned (R % 8 == 0, aligned bases)
  int chunk0[kMaxSlices + 1];  // first column-chunk block of each slice
};

__device__ __forceinline__ float load_in(const void* x, int dt, int64_t i) {
  if (dt == 0) return __ldg(static_cast<const float*>(x) + i);
  if (dt == 1) return __half2float(static_cast<const __half*>(x)[i]);
  return __bfloat162float(static_cast<const __nv_bfloat16*>(x)[i]);
}

// Blocks per SM a second build of the per-token kernels is held to (registers <= 65536 / (128 * n)).
// The wide rank-16 blocks (UNR 4) take 70 registers, 7 blocks per SM, so a 1024-block grid (H=4096,
// T=64) ran in 1.11 waves (ncu, results/NOTES.md v24); held to 8 they take 64 (8 per SM). The rank-64
// blocks (G 8, UNR 2): 44 -> 40 registers, 10 -> 12 blocks per SM. launch_cfg takes the held build
// only where its grid needs fewer waves: with as many waves the leaner registers measured slower
// (expand T=1 rank 64 +0.05-0.1 µs; add_lora_linear qkv T=16 rank 16, behind the decode shrink,
// +0.25-0.66 µs).
constexpr int dec_min_blocks(int G, int UNR, bool per_token) {
  return !per_token ? 0 : (G == 2 && UNR == 4) ? 8 : (G == 8 && UNR == 2) ? 12 : 0;
}

// 4 warps. Block = UNR steps of 4 * (32 / G) columns; lane (lig, cidx) holds k-vectors lig + i*G.
// MINB: blocks per SM the build is held to; 0 leaves the registers to ptxas (as no second bound).
template <class T, int G, int KV, int UNR, int TB, bool PER_TOKEN, int MINB = 0>
__global__ void __launch_bounds__(H::kDecThreads, MINB) expand_decode_kernel(DecodeParams p) {
  constexpr int CPW = 32 / G;
  constexpr int STEP = (H::kDecThreads / 32) * CPW;
  constexpr int COLS = STEP * UNR;
  pdl_launch_dependents();
  // Until griddepcontrol.wait (pdl_wait below) this block reads only the metadata, the ranks and B,
  // which no kernel of a LoRA op writes (the precondition in expand_decode.h), so their loads overlap
  // the previous kernel's tail; x (add_lora_linear's shrink output) and y are read after the wait.
  int s = 0;
#pragma unroll 1
  while (s + 1 < p.S && int(blockIdx.x) >= p.chunk0[s + 1]) ++s;
  const int64_t Ns = p.n[s];
  const int64_t n0 = int64_t(int(blockIdx.x) - p.chunk0[s]) * COLS;
  int l = -1;
  int tok[TB];
  if (PER_TOKEN) {
    static_assert(!PER_TOKEN || TB == 1, "one token per block");
    tok[0] = blockIdx.y;
  } else {
    TileRef tr;
    if (!find_tile(p.meta, p.L + 1, TB, blockIdx.y, tr)) return;
    l = tr.slot;
    const int nt = tr.rows(TB);
    const int start = tr.first(TB);
#pragma unroll
    for (int tt = 0; tt < TB; ++tt) tok[tt] = tt < nt ? p.meta.sorted_token_ids[start + tt] : -1;
  }
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int lig = lane & (G - 1), cidx = lane / G;
  // Every slot's rank up front (up to 32 slots): the slot's rank is then a shuffle, not a load that
  // waits for the slot.
  const int rk = lane < p.L ? p.ranks[lane] : 0;
  if (PER_TOKEN) {
    l = p.meta.token_lora_mapping[tok[0]];
    if (l < 0) return;
  }
  // B (and below x) up to kb: the slot's true rank where the ranks came with the slot (up to 32
  // slots: a shuffle, no load between the slot and B's loads), else the padded rank R. A mixed-rank
  // batch's rank-8 token then reads 8 of B's R columns, not R (off-grid bench on the H100 at 54cb5c7,
  // ranks 8 / 32 / 128, T=7, Llama gate_up: 41.7 µs here against 16.8 for the streaming kernel, as
  // slow as uniform rank 128). The values are masked to k < r with a select once r is known, so
  // padding (0 or NaN) never reaches the sums.
  const int rl = __shfl_sync(0xffffffffu, rk, l & 31);
  const int kb = p.L <= 32 ? min(rl, p.R) : p.R;
  const T* B = static_cast<const T*>(p.b[s]) + int64_t(l) * Ns * p.R;
  float b[UNR][KV][8];
#pragma unroll
  for (int u = 0; u < UNR; ++u) {
    const int64_t c = n0 + u * STEP + warp * CPW + cidx;
    const bool valid = c < Ns;
    const T* brow = B + c * p.R;
#pragma unroll
    for (int i = 0; i < KV; ++i) {
      const int k = (lig + i * G) * 8;
      if (valid && k < kb) {
        if (p.vecb) {  // R % 8 == 0: the 8 elements are in the row
          load8<T>(brow + k, b[u][i]);
        } else {
#pragma unroll
          for (int e = 0; e < 8; ++e) b[u][i][e] = k + e < kb ? to_f<T>(brow[k + e]) : 0.f;
        }
      } else {
#pragma unroll
        for (int e = 0; e < 8; ++e) b[u][i][e] = 0.f;
      }
    }
  }
  pdl_wait();  // x and y may be written by the previous kernel on the stream
  float xr[KV][TB][8];
#pragma unroll
  for (int i = 0; i < KV; ++i)
#pragma unroll
    for (int tt = 0; tt < TB; ++tt)
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        const int k = (lig + i * G) * 8 + e;
        xr[i][tt][e] = (tok[tt] >= 0 && k < kb) ? load_in(p.x, p.xdt, (int64_t(s) * p.T + tok[tt]) * p.R + k) : 0.f;
      }
  T* Y = static_cast<T*>(p.y) + p.col[s];
  // (per token: a -1 token's block has returned; token tiles: a -1 row is read, never written)
  float old[UNR][TB];
#pragma unroll
  for (int u = 0; u < UNR; ++u) {
    const int64_t c = n0 + u * STEP + warp * CPW + cidx;
#pragma unroll
    for (int tt = 0; tt < TB; ++tt)
      old[u][tt] = (c < Ns && p.add && tok[tt] >= 0 && (tt % G) == lig) ? to_f<T>(Y[int64_t(tok[tt]) * p.ldy + c])
                                                                        : 0.f;
  }
  const int r = min(p.L <= 32 ? rl : p.ranks[l], p.R);
#pragma unroll
  for (int i = 0; i < KV; ++i)
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      const bool in = (lig + i * G) * 8 + e < r;
#pragma unroll
      for (int tt = 0; tt < TB; ++tt) xr[i][tt][e] = in ? round_to<T>(xr[i][tt][e]) : 0.f;
#pragma unroll
      for (int u = 0; u < UNR; ++u) b[u][i][e] = in ? b[u][i][e] : 0.f;
    }

  float acc[UNR][TB];
#pragma unroll
  for (int u = 0; u < UNR; ++u)
#pragma unroll
    for (int tt = 0; tt < TB; ++tt) {
      float a = 0.f;
#pragma unroll
      for (int i = 0; i < KV; ++i)
#pragma unroll
        for (int e = 0; e < 8; ++e) a = fmaf(b[u][i][e], xr[i][tt][e], a);
      acc[u][tt] = a;
    }
#pragma unroll
  for (int off = G >> 1; off; off >>= 1)
#pragma unroll
    for (int u = 0; u < UNR; ++u)
#pragma unroll
      for (int tt = 0; tt < TB; ++tt) acc[u][tt] += __shfl_xor_sync(0xffffffffu, acc[u][tt], off);
#pragma unroll
  for (int u = 0; u < UNR; ++u) {
    const int64_t c = n0 + u * STEP + warp * CPW + cidx;
    if (c >= Ns) continue;
#pragma unroll
    for (int tt = 0; tt < TB; ++tt)
      if (tok[tt] >= 0 && (tt % G) == lig)
        Y[int64_t(tok[tt]) * p.ldy + c] = from_f<T>(old[u][tt] + round_to<T>(acc[u][tt]));
  }
}


// Blocks of `kernel` (kDecThreads threads, no shared memory) resident on the current device at once:
// its occupancy (cached per device; 1 where it cannot be read: the launch itself then says why) x SMs.
template <class K>
int device_wave(std::atomic<int>* cache, K kernel) {
  const int per_sm = lora_dev::per_device_cached(cache, [&](int dev) {
    int v = 0;
    if (dev < 0 || cudaOccupancyMaxActiveBlocksPerMultiprocessor(&v, kernel, H::kDecThreads, 0) != cudaSuccess || v <= 0) {
      cudaGetLastError();
      return 1;
    }
    return v;
  });
  return per_sm * detail::num_sms_cached();
}

template <class T, int G, int KV, int UNR, int TB, bool PT>
void launch_cfg(DecodeParams p, int64_t tiles, cudaStream_t st) {
  constexpr int COLS = (H::kDecThreads / 32) * (32 / G) * UNR;
  int chunks = 0;
  for (int s = 0; s < p.S; ++s) {
    p.chunk0[s] = chunks;
    chunks += int((p.n[s] + COLS - 1) / COLS);
  }
  for (int s = p.S; s <= kMaxSlices; ++s) p.chunk0[s] = chunks;
  if (chunks == 0 || tiles == 0) return;
  PUNICA_REQUIRE(tiles <= 65535, ErrorKind::usage, "lora_expand: too many tokens for the decode kernel");
  const dim3 grid(unsigned(chunks), unsigned(tiles), 1);
  constexpr int MB = dec_min_blocks(G, UNR, PT);
  if constexpr (MB > 0) {
    // Blocks the device holds at once, per build (occupancy x SMs; cached per device).
    static std::atomic<int> wave_plain[64], wave_held[64];
    const int64_t blocks = int64_t(chunks) * tiles;
    if (H::decode_fewer_waves(blocks, device_wave(wave_plain, expand_decode_kernel<T, G, KV, UNR, TB, PT>),
                              device_wave(wave_held, expand_decode_kernel<T, G, KV, UNR, TB, PT, MB>))) {
      launch_kernel(expand_decode_kernel<T, G, KV, UNR, TB, PT, MB>, grid, dim3(H::kDecThreads), 0, st, true, p);
      return;
    }
  }
  launch_kernel(expand_decode_kernel<T, G, KV, UNR, TB, PT>, grid, dim3(H::kDecThreads), 0, st, true, p);
}

template <class T, int G, int KV, int UNR, int TB>
void launch_mode(const DecodeParams& p, bool per_token, cudaStream_t st) {
  if (per_token) {
    launch_cfg<T, G, KV, UNR, 1, true>(p, p.T, st);
  } else {
    const int64_t tiles = std::min<int64_t>(p.T, (p.T + TB - 1) / TB + std::min<int64_t>(p.E - 1, p.T));
    launch_cfg<T, G, KV, UNR, TB, false>(p, tiles, st);
  }
}

template <class T>
void launch_t(const DecodeParams& p, bool per_token, cudaStream_t st) {
  constexpr int W = H::kDecWideFactor, NW = H::kDecThreads / 32;
  static_assert(NW * (32 / 2) * 1 == H::kDecNarrowCols16, "expand_heur::kDecNarrowCols16");
  // rank <= 16: per-token blocks kDecWideFactor times wider when the narrow grid has many blocks
  if (per_token && H::decode_wide(p.T, p.n, p.S, p.R)) launch_cfg<T, 2, 1, W, 1, true>(p, p.T, st);
  else if (p.R <= 16) launch_mode<T, 2, 1, 1, H::kDecTokens>(p, per_token, st);
  else if (p.R <= 64) launch_mode<T, 8, 1, 2, H::kDecTokens>(p, per_token, st);
  else if (p.R <= 256) launch_mode<T, 32, 1, 4, H::kDecTokens>(p, per_token, st);
  else launch_mode<T, 32, 2, 4, H::kDecTokens>(p, per_token, st);
}

}  // namespace

namespace detail {

void launch_expand_decode(const LoraExpandArgs& a, cudaStream_t stream) {
  PUNICA_REQUIRE(a.num_slices >= 1 && a.num_slices <= kMaxSlices, ErrorKind::usage,
                 "lora_expand: num_slices must be in [1, 8]");
  PUNICA_REQUIRE(a.max_rank >= 0 && a.max_rank <= H::kDecMaxRank, ErrorKind::usage,
                 "lora_expand: max_rank above 512");
  PUNICA_REQUIRE(a.num_active_loras >= 0, ErrorKind::usage, "lora_expand: num_active_loras must be >= 0 (0 = not given)");
  if (a.num_tokens == 0 || a.max_loras == 0) return;
  DecodeParams p{};
  static_cast<ExpandCore&>(p) = expand_core(a);
  p.xdt = a.in_dtype == DType::f32 ? 0 : a.in_dtype == DType::f16 ? 1 : 2;
  p.vecb = expand_b_vec_ok(a) ? 1 : 0;
  const bool per_token = H::decode_per_token(a.num_tokens, a.max_loras);
  switch (a.dtype) {
    case DType::f32: launch_t<float>(p, per_token, stream); break;
    case DType::f16: launch_t<__half>(p, per_token, stream); break;
    case DType::bf16: launch_t<__nv_bfloat16>(p, per_token, stream); break;
  }
}

}  // namespace detail
}  // namespace punica::kernels
