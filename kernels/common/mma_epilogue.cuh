// The output of mma.sync m16n8 accumulators straight from registers: no shared-memory staging, no
// barrier. A warp that holds NT (1, 2 or 4) adjacent n-tiles of one 16-row m-tile has, per thread
// (g8 = lane / 4, c4 = lane % 4), the columns 2*c4, 2*c4 + 1 of each tile in rows g8 and g8 + 8:
// 2 contiguous elements. gather<NT> transposes each quad's words with NT / 2 xor-shuffle stages, so
// that the thread holds NT contiguous words (2*NT elements) of each of its rows, starting at column
// first_col<NT>(c4) of the warp's 8*NT columns: one 16-byte store per row for NT = 4 with 16-bit
// outputs (8-byte for NT = 2) instead of NT 4-byte ones. A word is two elements: a uint32_t of two
// packed 16-bit values, or a float2. (The MoE and delta expands staged the fp32 tile in shared memory
// between two barriers; ncu on the H100 at 54cb5c7 / ba9f6ab: those kernels issue-bound, the
// staging's bank conflicts and barriers part of it.)
// Every lane of the warp must call gather (it shuffles); column bounds are checked after it.
#pragma once
#include <cstdint>

#include "kernels/common/vec_store.cuh"

namespace punica::kernels::mma_epi {

__device__ __forceinline__ uint32_t shx(uint32_t v, int o) { return __shfl_xor_sync(0xffffffffu, v, o); }
__device__ __forceinline__ float2 shx(float2 v, int o) {
  return make_float2(__shfl_xor_sync(0xffffffffu, v.x, o), __shfl_xor_sync(0xffffffffu, v.y, o));
}
template <class W> __device__ __forceinline__ W sel(bool p, W a, W b) { return p ? a : b; }

// The column (within the warp's 8*NT) of the first element the thread holds after gather<NT>.
template <int NT>
__device__ __forceinline__ int first_col(int c4) {
  static_assert(NT == 1 || NT == 2 || NT == 4, "1, 2 or 4 n-tiles");
  if constexpr (NT == 4) return 8 * c4;                       // tile c4, all 8 columns
  else if constexpr (NT == 2) return 8 * (c4 & 1) + 4 * (c4 >> 1);  // tile c4 & 1, 4 columns
  else return 2 * c4;
}

// In: w[i] = the thread's word of tile i (columns 2*c4, 2*c4 + 1). Out: w[0..NT) contiguous words.
template <int NT, class W>
__device__ __forceinline__ void gather(W (&w)[NT], int c4) {
  if constexpr (NT >= 2) {
    // stage 1 (xor 1): in each tile pair (2h, 2h+1) lane bit b keeps tile 2h+b and takes its
    // partner's word of that tile: columns 4*(c4 >> 1) .. +3 of tile 2h+b, the even lane's first
    const bool b = c4 & 1;
    W u[NT / 2][2];
#pragma unroll
    for (int h = 0; h < NT / 2; ++h) {
      const W keep = sel(b, w[2 * h + 1], w[2 * h]);
      const W r = shx(sel(b, w[2 * h], w[2 * h + 1]), 1);
      u[h][0] = sel(b, r, keep);
      u[h][1] = sel(b, keep, r);
    }
    if constexpr (NT == 2) {
      w[0] = u[0][0];
      w[1] = u[0][1];
    } else {
      // stage 2 (xor 2): lane bit c keeps pair c (tile 2c+b, columns 4c .. 4c+3) and takes the
      // partner's half of that tile (columns 4(1-c) ..): tile c4 whole, in column order
      const bool c = (c4 >> 1) & 1;
      const W k0 = sel(c, u[1][0], u[0][0]), k1 = sel(c, u[1][1], u[0][1]);
      const W r0 = shx(sel(c, u[0][0], u[1][0]), 2), r1 = shx(sel(c, u[0][1], u[1][1]), 2);
      w[0] = sel(c, r0, k0);
      w[1] = sel(c, r1, k1);
      w[2] = sel(c, k0, r0);
      w[3] = sel(c, k1, r1);
    }
  }
}

// The low / high 16-bit element of a packed word.
__device__ __forceinline__ unsigned short lo16(uint32_t w) { return static_cast<unsigned short>(w & 0xffffu); }
__device__ __forceinline__ unsigned short hi16(uint32_t w) { return static_cast<unsigned short>(w >> 16); }

// Stores the NT packed words (2*NT 16-bit elements) at o, n of them valid: one 16 / 8 / 4-byte store
// when all are valid and o is aligned to their size, else element by element.
template <int NT>
__device__ __forceinline__ void store_words(void* o, const uint32_t (&w)[NT], int64_t n) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(o);
  if (n >= 2 * NT && (a & (4 * NT - 1)) == 0) {
    if constexpr (NT == 4) vec::st16(o, make_uint4(w[0], w[1], w[2], w[3]));
    else if constexpr (NT == 2) vec::st8(o, make_uint2(w[0], w[1]));
    else *static_cast<uint32_t*>(o) = w[0];
    return;
  }
  unsigned short* e = static_cast<unsigned short*>(o);
#pragma unroll
  for (int q = 0; q < NT; ++q) {
    if (2 * q < n) e[2 * q] = lo16(w[q]);
    if (2 * q + 1 < n) e[2 * q + 1] = hi16(w[q]);
  }
}
// The same for float2 words (2*NT floats).
template <int NT>
__device__ __forceinline__ void store_words(float* o, const float2 (&w)[NT], int64_t n) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(o);
  if (n >= 2 * NT && (a & (NT >= 2 ? 15 : 7)) == 0) {
#pragma unroll
    for (int q = 0; q + 1 < NT; q += 2) vec::st16(o + 2 * q, make_float4(w[q].x, w[q].y, w[q + 1].x, w[q + 1].y));
    if constexpr (NT == 1) vec::st8(o, w[0]);
    return;
  }
#pragma unroll
  for (int q = 0; q < NT; ++q) {
    if (2 * q < n) o[2 * q] = w[q].x;
    if (2 * q + 1 < n) o[2 * q + 1] = w[q].y;
  }
}
// o[0 .. n) += the NT float2 words (fp32 atomics: 16-byte ones where whole and aligned).
template <int NT>
__device__ __forceinline__ void add_words(float* o, const float2 (&w)[NT], int64_t n) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(o);
  if (NT >= 2 && n >= 2 * NT && (a & 15) == 0) {
#pragma unroll
    for (int q = 0; q + 1 < NT; q += 2)
      atomicAdd(reinterpret_cast<float4*>(o + 2 * q), make_float4(w[q].x, w[q].y, w[q + 1].x, w[q + 1].y));
    return;
  }
#pragma unroll
  for (int q = 0; q < NT; ++q) {
    if (2 * q < n) atomicAdd(o + 2 * q, w[q].x);
    if (2 * q + 1 < n) atomicAdd(o + 2 * q + 1, w[q].y);
  }
}

}  // namespace punica::kernels::mma_epi
