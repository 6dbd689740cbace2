// Streaming prefill expand (vLLM add_expand for T > 128): one block = BM tokens of one adapter
// (gathered through sorted_token_ids) x BN columns of one slice. Every global read of the block is
// asynchronous and issued together right after the token ids arrive: the y tile (cp.async, 16-byte
// chunks, into shared memory), the block's x rows (raw input dtype, cp.async) and B rows (cp.async),
// all zero-filled past the adapter's true rank so that padding is never read. One wait, the
// mma.sync products (x rounded to the weight dtype while the fragments are built), the rounded
// products added to the y tile in shared memory, then coalesced 16-byte stores.
// Why: the staged kernel (expand_mma_staged) issued its y tile only after the synchronous x loads had
// returned, and its register-heavy 32 x 64 warp tiles capped it at 3 blocks per SM with spills; ncu
// showed DRAM at 29% with the SMs waiting on that load chain. Here the y bytes are in flight for
// the whole life of the block and the warp tiles are sized so that no thread spills.
// Preconditions (checked by stream_ok on the host, otherwise the staged kernel runs): 16-bit y with
// 16-byte aligned rows and slice columns, B rows 16-byte aligned (max_rank % 8 == 0), x 16-byte
// aligned rows (max_rank % 4 == 0 for fp32 x, % 8 for 16-bit x).
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cstdint>
#include <type_traits>
#include "kernels/common/lora_types.h"
#include "kernels/lora_expand/expand_params.h"
#include "kernels/lora_shrink/lora_device.cuh"

namespace punica::kernels::expand_stream {

struct Params : ExpandCore {  // x: [S, T, R] of TI
  // Pipe kernel only: when set, x is an A table [L, x_vocab, R] and token t's x row is
  // A[l][x_ids[t]] (add_lora_embedding; ids outside [0, x_vocab) read as zeros). One slice.
  const int32_t* x_ids;
  int64_t x_vocab;
  // Launched as a programmatic dependent of whatever kernel precedes it (a standalone lora_expand):
  // every block reads only the metadata and the ranks before its griddepcontrol.wait (the
  // precondition of shrink_decode.h), and waits before it returns, so that this grid's completion
  // implies its predecessor's. 0: an ordinary launch, or add_lora_linear's expand behind its shrink.
  int wait_first;
};

template <class T> struct Pack2;
template <> struct Pack2<__nv_bfloat16> {
  static __device__ __forceinline__ uint32_t pack(float a, float b) {
    __nv_bfloat162 v = __floats2bfloat162_rn(a, b);
    return *reinterpret_cast<uint32_t*>(&v);
  }
  static __device__ __forceinline__ uint32_t add(uint32_t a, uint32_t b) {
    const __nv_bfloat162 v =
        __hadd2(*reinterpret_cast<const __nv_bfloat162*>(&a), *reinterpret_cast<const __nv_bfloat162*>(&b));
    return *reinterpret_cast<const uint32_t*>(&v);
  }
};
template <> struct Pack2<__half> {
  static __device__ __forceinline__ uint32_t pack(float a, float b) {
    __half2 v = __floats2half2_rn(a, b);
    return *reinterpret_cast<uint32_t*>(&v);
  }
  static __device__ __forceinline__ uint32_t add(uint32_t a, uint32_t b) {
    const __half2 v = __hadd2(*reinterpret_cast<const __half2*>(&a), *reinterpret_cast<const __half2*>(&b));
    return *reinterpret_cast<const uint32_t*>(&v);
  }
};

// Two consecutive x values (shared memory, raw input dtype) as a packed pair of T: vLLM casts the
// fp32 intermediate to the weight dtype before the dot.
template <class T, class TI>
__device__ __forceinline__ uint32_t xpair(const TI* src) {
  if constexpr (std::is_same_v<TI, T>) {
    return *reinterpret_cast<const uint32_t*>(src);
  } else if constexpr (std::is_same_v<TI, float>) {
    const float2 f = *reinterpret_cast<const float2*>(src);
    return Pack2<T>::pack(f.x, f.y);
  } else {
    return Pack2<T>::pack(lora_dev::to_f<TI>(src[0]), lora_dev::to_f<TI>(src[1]));
  }
}

// Rounded products (+ the old y already in the tile) into the shared y tile: each thread owns its
// mma fragment elements (warp (wm, wn) covers rows wm*TM.. and columns wn*TN..). The pair of
// products is rounded to T (vLLM rounds the dot to the output dtype) and added to the old pair in
// T arithmetic (one HADD2): the exact sum of two T values rounded once, which equals the fp32 sum
// rounded to T (the fp32 sum of two bf16 / fp16 values is exact unless their exponents differ by
// more than 16 / 13 bits, and then the smaller one is below half an ulp of T).
template <class T, int MI, int NI, int TM, int TN, int YP>
__device__ __forceinline__ void add_products(T* tile, const float (&acc)[MI][NI][4], int wm, int wn, int lane,
                                             bool add) {
  const int g = lane >> 2, q = lane & 3;
#pragma unroll
  for (int mi = 0; mi < MI; ++mi)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = wm * TM + mi * 16 + g + 8 * h;
#pragma unroll
      for (int ni = 0; ni < NI; ++ni) {
        uint32_t* e = reinterpret_cast<uint32_t*>(tile + row * YP + wn * TN + ni * 8 + 2 * q);
        const uint32_t v = Pack2<T>::pack(acc[mi][ni][2 * h], acc[mi][ni][2 * h + 1]);
        *e = add ? Pack2<T>::add(v, *e) : v;
      }
    }
}

// The 16-byte chunks one thread moves between a BM x BN y tile in shared memory (row pitch YP) and
// the gathered y rows in global memory: with NT threads, thread i always owns column chunk
// i % (BN / 8) of rows i / (BN / 8) + k * NT / (BN / 8). The rows (token ids, -1 = no token) are
// read once per block, so that a pipelined block moving several column tiles of the same rows pays
// an add (or one wide multiply-add) per chunk instead of the index arithmetic, the token-id load
// and the checks (ncu, git f5a0ad2: that arithmetic was ~30% of the pipe kernel's instructions).
template <class T, int BM, int BN, int YP, int NT>
struct TileRows {
  static constexpr int CPR = BN / 8, RSTEP = NT / CPR, P = BM * CPR / NT;
  static_assert(NT % CPR == 0 && (BM * CPR) % NT == 0, "whole rows per pass");
  // Up to two rows per thread: the 64-bit offsets are held; more rows: the token ids (32-bit) are
  // held and the offset is formed on use, which keeps the 64-register configuration (four rows per
  // thread) from losing registers to eight offset halves.
  static constexpr bool kHold64 = P <= 2;
  using Held = std::conditional_t<kHold64, int64_t, int>;
  Held h[P];
  int64_t ldy;
  int c, row0;
  __device__ __forceinline__ void init(const int* stok, int64_t ldy_) {
    ldy = ldy_;
    c = (int(threadIdx.x) % CPR) * 8;
    row0 = int(threadIdx.x) / CPR;
#pragma unroll
    for (int k = 0; k < P; ++k) {
      const int t = stok[row0 + k * RSTEP];
      if constexpr (kHold64) h[k] = t >= 0 ? int64_t(t) * ldy + c : -1;
      else h[k] = t;
    }
  }
  __device__ __forceinline__ bool has(int k) const { return h[k] >= 0; }
  __device__ __forceinline__ int64_t off(int k) const {
    if constexpr (kHold64) return h[k];
    else return int64_t(h[k]) * ldy + c;
  }
  // Y: the tile's first column (slice base + n0); nvalid: valid columns of the tile (<= BN).
  // cp.async, zero-filled past nvalid, not committed.
  __device__ __forceinline__ void load_async(T* tile, const T* Y, int nvalid) const {
    if (c >= nvalid) return;
    const int nb = 2 * min(8, nvalid - c);
#pragma unroll
    for (int k = 0; k < P; ++k)
      if (has(k)) lora_dev::cp_async16(lora_dev::smem_u32(tile + (row0 + k * RSTEP) * YP + c), Y + off(k), nb);
  }
  // 16-byte coalesced stores; the last partial chunk of a slice element by element.
  __device__ __forceinline__ void store(T* Y, const T* tile, int nvalid) const {
    if (c >= nvalid) return;
#pragma unroll
    for (int k = 0; k < P; ++k) {
      if (!has(k)) continue;
      T* dst = Y + off(k);
      const T* src = tile + (row0 + k * RSTEP) * YP + c;
      if (c + 8 <= nvalid) {
        *reinterpret_cast<uint4*>(dst) = *reinterpret_cast<const uint4*>(src);
      } else {
        for (int e = 0; e < nvalid - c; ++e) dst[e] = src[e];
      }
    }
  }
};

// KS: rank chunks in shared memory (1: each chunk loaded behind the last one's mma; 2: chunk k + 1
// loaded while chunk k is multiplied). x_bytes / b_bytes are one chunk's; x's KS chunks, then B's.
template <int BM, int BN, int BK, class TI, int KS = 1>
struct Layout {
  static constexpr int YP = BN + 8;                  // y row pitch (elements of T, 2 bytes)
  static constexpr int XP = BK + 16 / int(sizeof(TI)) * 2;  // x row pitch (elements of TI)
  static constexpr int BP = BK + 8;                  // B row pitch (elements of T)
  static constexpr unsigned y_bytes = unsigned(BM) * YP * 2;
  static constexpr unsigned x_bytes = unsigned(BM) * XP * sizeof(TI);
  static constexpr unsigned b_bytes = unsigned(BN) * BP * 2;
  static constexpr unsigned total = y_bytes + KS * (x_bytes + b_bytes);
};

// grid (ceil(max N / BN), ceil(T / BM) + L + 1 token tiles bound, S); WM x WN warps, each
// (BM / WM) tokens x (BN / WN) columns. KS: see Layout (2 for ranks above 64, heuristics.h).
template <class T, class TI, int BM, int BN, int BK, int WM, int WN, int MINB, int KS = 1>
__global__ void __launch_bounds__(WM * WN * 32, MINB) expand_stream_kernel(Params p) {
  using namespace lora_dev;
  constexpr int NT = WM * WN * 32, TM = BM / WM, TN = BN / WN, MI = TM / 16, NI = TN / 8;
  static_assert(TM % 16 == 0 && TN % 16 == 0 && BK % 16 == 0, "warp tile of m16n8k16 steps");
  static_assert(KS == 1 || KS == 2, "one or two rank chunks in shared memory");
  using Lay = Layout<BM, BN, BK, TI, KS>;
  constexpr int YP = Lay::YP, XP = Lay::XP, BP = Lay::BP;
  constexpr int XC = 16 / int(sizeof(TI));  // x elements per 16-byte chunk
  extern __shared__ __align__(128) unsigned char es_smem[];
  T* const sy = reinterpret_cast<T*>(es_smem);
  TI* const sx0 = reinterpret_cast<TI*>(es_smem + Lay::y_bytes);
  T* const sb0 = reinterpret_cast<T*>(es_smem + Lay::y_bytes + KS * Lay::x_bytes);
  __shared__ int stok[BM];

  pdl_launch_dependents();  // the next kernel may launch; it waits for this grid before reading y
  const int s = blockIdx.z;
  const int64_t Ns = p.n[s];
  const int64_t n0 = int64_t(blockIdx.x) * BN;
  TileRef tr;
  if (*p.meta.no_lora_flag || n0 >= Ns || !find_tile(p.meta, p.L + 1, BM, blockIdx.y, tr)) {
    if (p.wait_first) pdl_wait();
    return;
  }
  const int l = tr.slot;
  const int r = p.ranks[l];
  const int rows = tr.rows(BM);
  const int start = tr.first(BM);
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int nvalid = Ns - n0 < BN ? int(Ns - n0) : BN;
  const T* B = static_cast<const T*>(p.b[s]) + (int64_t(l) * Ns + n0) * p.R;
  const TI* X = static_cast<const TI*>(p.x) + int64_t(s) * p.T * p.R;
  T* Y = static_cast<T*>(p.y) + p.col[s] + n0;
  for (int i = tid; i < BM; i += NT) stok[i] = i < rows ? p.meta.sorted_token_ids[start + i] : -1;
  if (p.wait_first) pdl_wait();  // x, B and y only after the kernel before this one is done
  __syncthreads();

  // x / B of rank chunk [k0, k0 + BK) into buffer buf: 16-byte cp.async, zero-filled past the true rank.
  auto stage = [&](int k0, int buf) {
    TI* const sx = sx0 + buf * (BM * XP);
    T* const sb = sb0 + buf * (BN * BP);
    const int kl = min(BK, r - k0);  // valid ranks in this chunk (>= 1)
    constexpr int XCPR = BK / XC;
    for (int idx = tid; idx < BM * XCPR; idx += NT) {
      const int row = idx / XCPR, k = (idx % XCPR) * XC;
      const int t = stok[row];
      const int nb = (t >= 0 && k < kl) ? min(XC, kl - k) * int(sizeof(TI)) : 0;
      cp_async16(smem_u32(sx + row * XP + k), nb ? X + int64_t(t) * p.R + k0 + k : X, nb);
    }
    constexpr int BCPR = BK / 8;
    for (int idx = tid; idx < BN * BCPR; idx += NT) {
      const int row = idx / BCPR, k = (idx % BCPR) * 8;
      const int nb = (row < nvalid && k < kl) ? 2 * min(8, kl - k) : 0;
      cp_async16(smem_u32(sb + row * BP + k), nb ? B + int64_t(row) * p.R + k0 + k : B, nb);
    }
  };

  // The y tile first (only when added to): the longest-latency bytes leave before anything else.
  if (p.add) {  // the row offsets are recomputed for the store: not held through the mma loop
    TileRows<T, BM, BN, YP, NT> yrows;
    yrows.init(stok, p.ldy);
    yrows.load_async(sy, Y, nvalid);
  }
  stage(0, 0);
  cp_async_commit();

  const int wm = warp / WN, wn = warp % WN;
  const int g = lane >> 2, q = lane & 3, mi8 = lane >> 3;
  float acc[MI][NI][4];
#pragma unroll
  for (int a = 0; a < MI; ++a)
#pragma unroll
    for (int b = 0; b < NI; ++b)
#pragma unroll
      for (int c = 0; c < 4; ++c) acc[a][b][c] = 0.f;

  for (int k0 = 0, it = 0; k0 < r; k0 += BK, ++it) {
    const int buf = KS == 1 ? 0 : (it & 1);
    if constexpr (KS == 1) {
      if (k0 > 0) {
        __syncthreads();  // every warp is done with the previous chunk
        stage(k0, 0);
        cp_async_commit();
      }
      cp_async_wait<0>();
      __syncthreads();
    } else {
      // chunk it has landed for every thread, and every warp is done with chunk it - 1, whose
      // buffer chunk it + 1 now fills while chunk it is multiplied
      cp_async_wait<0>();
      __syncthreads();
      if (k0 + BK < r) {
        stage(k0 + BK, buf ^ 1);
        cp_async_commit();
      }
    }
    const TI* const sx = sx0 + buf * (BM * XP);
    const T* const sb = sb0 + buf * (BN * BP);
    const int nks = min(BK / 16, (r - k0 + 15) / 16);
    for (int kk = 0; kk < nks; ++kk) {
      uint32_t af[MI][4];
#pragma unroll
      for (int mi = 0; mi < MI; ++mi) {
        const TI* xr = sx + (wm * TM + mi * 16 + g) * XP + kk * 16 + 2 * q;
        af[mi][0] = xpair<T, TI>(xr);
        af[mi][1] = xpair<T, TI>(xr + 8 * XP);
        af[mi][2] = xpair<T, TI>(xr + 8);
        af[mi][3] = xpair<T, TI>(xr + 8 * XP + 8);
      }
#pragma unroll
      for (int pn = 0; pn < NI / 2; ++pn) {
        uint32_t bf[4];
        ldmatrix_x4(bf, smem_u32(sb + (wn * TN + pn * 16 + (mi8 >> 1) * 8 + (lane & 7)) * BP + kk * 16 +
                                 (mi8 & 1) * 8));
#pragma unroll
        for (int mi = 0; mi < MI; ++mi) {
          MmaOp<T>::run(acc[mi][2 * pn], af[mi], bf[0], bf[1]);
          MmaOp<T>::run(acc[mi][2 * pn + 1], af[mi], bf[2], bf[3]);
        }
      }
    }
  }
  if (r <= 0) {  // rank-0 adapter: nothing was staged; y is rewritten unchanged (or zeroed)
    cp_async_wait<0>();
    __syncthreads();
  }

  add_products<T, MI, NI, TM, TN, YP>(sy, acc, wm, wn, lane, p.add);
  __syncthreads();
  TileRows<T, BM, BN, YP, NT> yrows;
  yrows.init(stok, p.ldy);
  yrows.store(Y, sy, nvalid);
}

// Pipelined variant for max_rank <= RK (the common LoRA ranks): a block owns BM tokens of one
// adapter and `ntb` consecutive BN-column tiles of one slice. The token ids and x rows are loaded
// once per block; the y and B tiles of column tile j + NS - 1 are issued (cp.async) while tile j is
// multiplied and stored, so that NS - 1 tiles of y are in flight through the whole life of the
// block and the metadata chain (flag -> tile lookup -> token ids) is paid once per ntb tiles.
// grid (sum over slices of ceil(ceil(N_s / BN) / ntb), ceil(T / BM) + L + 1 token tiles bound).
template <int BM, int BN, int RK, int NS>
struct PipeLayout {
  static constexpr int YP = BN + 8, KP = RK + 8;
  static constexpr unsigned y_stage = unsigned(BM) * YP * 2, b_stage = unsigned(BN) * KP * 2;
  static constexpr unsigned x_off = NS * (y_stage + b_stage);
  static constexpr unsigned total = x_off + unsigned(BM) * KP * 2;
};

// The pipelined kernel's work after its prologue: column tiles [j0, j0 + jn) (of BN columns) of
// slice s for the block's token rows (stok, filled and synchronised) of adapter slot l with true
// rank r. smem: PipeLayout<BM, BN, RK, NS>::total bytes.
template <class T, class TI, int BM, int BN, int RK, int WM, int WN, int NS>
__device__ __forceinline__ void pipe_tiles(const Params& p, unsigned char* ep_smem, const int* stok, int s, int j0,
                                           int jn, int l, int r) {
  using namespace lora_dev;
  constexpr int NT = WM * WN * 32, TM = BM / WM, TN = BN / WN, MI = TM / 16, NI = TN / 8;
  static_assert(TM % 16 == 0 && TN % 16 == 0 && RK % 16 == 0 && NS >= 2, "tile shape");
  using Lay = PipeLayout<BM, BN, RK, NS>;
  constexpr int YP = Lay::YP, KP = Lay::KP;
  T* const sy = reinterpret_cast<T*>(ep_smem);                                  // [NS][BM][YP]
  T* const sb = reinterpret_cast<T*>(ep_smem + NS * Lay::y_stage);               // [NS][BN][KP]
  T* const sx = reinterpret_cast<T*>(ep_smem + Lay::x_off);                      // [BM][KP]
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int64_t Ns = p.n[s];
  const T* Bl = static_cast<const T*>(p.b[s]) + int64_t(l) * Ns * p.R;
  T* const Ys = static_cast<T*>(p.y) + p.col[s];
  TileRows<T, BM, BN, YP, NT> yrows;
  yrows.init(stok, p.ldy);

  // y and B of column tile j (block-relative) into stage j % NS; B zero-filled past the true rank.
  auto issue = [&](int j) {
    const int64_t n0 = int64_t(j0 + j) * BN;
    const int nvalid = Ns - n0 < BN ? int(Ns - n0) : BN;
    T* const dy = sy + (j % NS) * (BM * YP);
    if (p.add) yrows.load_async(dy, Ys + n0, nvalid);
    T* const db = sb + (j % NS) * (BN * KP);
    constexpr int BCPR = RK / 8;
    const T* Bt = Bl + n0 * p.R;
    for (int idx = tid; idx < BN * BCPR; idx += NT) {
      const int row = idx / BCPR, k = (idx % BCPR) * 8;
      const int nb = (row < nvalid && k < r) ? 2 * min(8, r - k) : 0;
      cp_async16(smem_u32(db + row * KP + k), nb ? Bt + int64_t(row) * p.R + k : Bt, nb);
    }
  };
#pragma unroll
  for (int j = 0; j < NS - 1; ++j) {
    if (j < jn) issue(j);
    cp_async_commit();
  }
  // x rows (rounded to T, zero past the true rank), synchronous: the tiles above are in flight.
  // Launched as a programmatic dependent of the shrink that writes x (add_lora_linear): wait for it
  // here, after the y / B loads are issued (a no-op for an ordinary launch).
  pdl_wait();
  {
    const TI* X = static_cast<const TI*>(p.x) + int64_t(s) * p.T * p.R;
    constexpr int QPR = RK / 4;
    for (int idx = tid; idx < BM * QPR; idx += NT) {
      const int row = idx / QPR, k = (idx % QPR) * 4;
      const int t = stok[row];
      float v[4] = {0.f, 0.f, 0.f, 0.f};
      int64_t xr = t;  // x row of the token
      if (p.x_ids != nullptr && t >= 0) {
        const int32_t id = p.x_ids[t];
        xr = id >= 0 && id < p.x_vocab ? int64_t(l) * p.x_vocab + id : -1;
      }
      if (xr >= 0 && k < r) {
        const TI* src = X + xr * p.R + k;
        if (k + 4 <= r) {
          if constexpr (std::is_same_v<TI, float>) {
            const float4 f = __ldg(reinterpret_cast<const float4*>(src));
            v[0] = f.x; v[1] = f.y; v[2] = f.z; v[3] = f.w;
          } else {
            const uint2 u = __ldg(reinterpret_cast<const uint2*>(src));
            const TI* h = reinterpret_cast<const TI*>(&u);
#pragma unroll
            for (int e = 0; e < 4; ++e) v[e] = to_f<TI>(h[e]);
          }
        } else {
#pragma unroll
          for (int e = 0; e < 4; ++e)  // constant bounds keep v in registers (no stack frame)
            if (e < r - k) v[e] = to_f<TI>(src[e]);
        }
      }
      uint2 w;
      w.x = Pack2<T>::pack(v[0], v[1]);
      w.y = Pack2<T>::pack(v[2], v[3]);
      *reinterpret_cast<uint2*>(sx + row * KP + k) = w;
    }
  }

  const int wm = warp / WN, wn = warp % WN;
  const int mi8 = lane >> 3;
  const int nks = (r + 15) >> 4;
  for (int j = 0; j < jn; ++j) {
    cp_async_wait<NS - 2>();
    __syncthreads();  // tile j landed; stage (j - 1) % NS fully stored
    if (j + NS - 1 < jn) issue(j + NS - 1);
    cp_async_commit();
    const T* cb = sb + (j % NS) * (BN * KP);
    float acc[MI][NI][4];
#pragma unroll
    for (int a = 0; a < MI; ++a)
#pragma unroll
      for (int b = 0; b < NI; ++b)
#pragma unroll
        for (int c = 0; c < 4; ++c) acc[a][b][c] = 0.f;
#pragma unroll
    for (int kk = 0; kk < RK / 16; ++kk) {
      if (kk < nks) {
        uint32_t af[MI][4];
#pragma unroll
        for (int mi = 0; mi < MI; ++mi)
          ldmatrix_x4(af[mi], smem_u32(sx + (wm * TM + mi * 16 + (lane & 15)) * KP + kk * 16 + (lane >> 4) * 8));
#pragma unroll
        for (int pn = 0; pn < NI / 2; ++pn) {
          uint32_t bf[4];
          ldmatrix_x4(bf, smem_u32(cb + (wn * TN + pn * 16 + (mi8 >> 1) * 8 + (lane & 7)) * KP + kk * 16 +
                                   (mi8 & 1) * 8));
#pragma unroll
          for (int mi = 0; mi < MI; ++mi) {
            MmaOp<T>::run(acc[mi][2 * pn], af[mi], bf[0], bf[1]);
            MmaOp<T>::run(acc[mi][2 * pn + 1], af[mi], bf[2], bf[3]);
          }
        }
      }
    }
    T* const cy = sy + (j % NS) * (BM * YP);
    add_products<T, MI, NI, TM, TN, YP>(cy, acc, wm, wn, lane, p.add);
    __syncthreads();
    const int64_t n0 = int64_t(j0 + j) * BN;
    yrows.store(Ys + n0, cy, Ns - n0 < BN ? int(Ns - n0) : BN);
  }
  cp_async_wait<0>();
}

// The block's prologue, shared by the pipelined kernels: its slice s and first column tile j0 (of
// BN columns; blockIdx.x enumerates groups of ntb tiles, slice after slice), jn tiles, its token
// tile (blockIdx.y) with the token ids in stok (synchronised), the adapter slot l and its true rank
// r. false: the block has no work (it has waited for its predecessor where wait_first says so).
template <int BM, int BN, int NT>
__device__ __forceinline__ bool pipe_prologue(const Params& p, int ntb, int* stok, int& s, int& j0, int& jn, int& l,
                                              int& r) {
  using namespace lora_dev;
  pdl_launch_dependents();  // the next kernel may launch; it waits for this grid before reading y
  int grp = blockIdx.x, nct = 0;
  for (s = 0;; ++s) {
    if (s >= p.S) {
      if (p.wait_first) pdl_wait();
      return false;
    }
    nct = int((p.n[s] + BN - 1) / BN);
    const int ng = (nct + ntb - 1) / ntb;
    if (grp < ng) break;
    grp -= ng;
  }
  j0 = grp * ntb;
  jn = min(ntb, nct - j0);
  TileRef tr;
  const int flag = *p.meta.no_lora_flag;  // independent load, in flight with the tile lookup
  if (!find_tile(p.meta, p.L + 1, BM, blockIdx.y, tr) || flag) {
    if (p.wait_first) pdl_wait();
    return false;
  }
  l = tr.slot;
  const int rows = tr.rows(BM);
  const int start = tr.first(BM);
  for (int i = threadIdx.x; i < BM; i += NT) stok[i] = i < rows ? p.meta.sorted_token_ids[start + i] : -1;
  r = p.ranks[l];
  if (p.wait_first) pdl_wait();  // y, B and x only after the kernel before this one is done
  __syncthreads();
  return true;
}

template <class T, class TI, int BM, int BN, int RK, int WM, int WN, int NS, int MINB>
__global__ void __launch_bounds__(WM * WN * 32, MINB) expand_pipe_kernel(Params p, int ntb) {
  extern __shared__ __align__(128) unsigned char ep_smem[];
  __shared__ int stok[BM];
  int s, j0, jn, l, r;
  if (!pipe_prologue<BM, BN, WM * WN * 32>(p, ntb, stok, s, j0, jn, l, r)) return;
  pipe_tiles<T, TI, BM, BN, RK, WM, WN, NS>(p, ep_smem, stok, s, j0, jn, l, r);
}

// Ranks 17-64 with the tiles chosen per block by its adapter's true rank (mixed-rank batches: the
// host sees only max_rank). The prologue of the 64 x 64 kernel (groups of ntb 64-column tiles, ntb
// even), then for rank <= 16 the rank-16 kernel's tiles (64 x 128, 2 stages, B staged 16 ranks wide:
// the same columns as ntb / 2 tiles; an odd jn only at a slice's end, where the last tile is
// clipped), else the 64 x 64 tiles with 3 stages. Shared memory: the larger of the two layouts.
// Held to 72 registers, the 64 x 64 kernel's own count (ptxas: no spills; left to itself ptxas took
// 78 and add_lora_linear's qkv rank-64 T=8192 ran 1.02-1.05x slower back to back, results/NOTES.md
// v30), so that both keep 3 blocks per SM.
using DualLo = PipeLayout<64, 128, 16, 2>;
using DualHi = PipeLayout<64, 64, 64, 3>;
constexpr unsigned kDualSmem = DualLo::total > DualHi::total ? DualLo::total : DualHi::total;
template <class T, class TI>
__global__ void __maxnreg__(72) expand_pipe_dual_kernel(Params p, int ntb) {
  extern __shared__ __align__(128) unsigned char ep_smem[];
  __shared__ int stok[64];
  int s, j0, jn, l, r;
  if (!pipe_prologue<64, 64, 256>(p, ntb, stok, s, j0, jn, l, r)) return;
  if (r <= 16) pipe_tiles<T, TI, 64, 128, 16, 2, 4, 2>(p, ep_smem, stok, s, j0 / 2, (jn + 1) / 2, l, r);
  else pipe_tiles<T, TI, 64, 64, 64, 4, 2, 3>(p, ep_smem, stok, s, j0, jn, l, r);
}

}  // namespace punica::kernels::expand_stream
