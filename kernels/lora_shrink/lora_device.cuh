// Device building blocks shared by the Punica LoRA kernels (lora_shrink, lora_expand,
// add_lora_linear): dtype conversions with vLLM's roundings, 16-byte loads, cp.async / ldmatrix /
// mma.sync wrappers, programmatic-dependent-launch controls and the "which adapter tile am I"
// lookup over vLLM's LoRAKernelMeta (tokens sorted by slot).
#pragma once
#include <atomic>
#include <cstdint>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cstddef>
#include <utility>
#include <cuda_runtime.h>
#include "kernels/common/cuda_check.h"
#include "kernels/common/lora_types.h"

namespace punica::kernels::lora_dev {

// ---- conversions ----
template <class T> __device__ __forceinline__ float to_f(T v);
template <> __device__ __forceinline__ float to_f<float>(float v) { return v; }
template <> __device__ __forceinline__ float to_f<__half>(__half v) { return __half2float(v); }
template <> __device__ __forceinline__ float to_f<__nv_bfloat16>(__nv_bfloat16 v) {
  return __bfloat162float(v);
}
template <class T> __device__ __forceinline__ T from_f(float v);
template <> __device__ __forceinline__ float from_f<float>(float v) { return v; }
template <> __device__ __forceinline__ __half from_f<__half>(float v) { return __float2half_rn(v); }
template <> __device__ __forceinline__ __nv_bfloat16 from_f<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}
// What a store to T followed by a load does (vLLM's cast of the rank-r intermediate).
template <class T> __device__ __forceinline__ float round_to(float v) { return to_f<T>(from_f<T>(v)); }

// 8 consecutive elements, p 16-byte aligned (read-only path).
template <class T> __device__ __forceinline__ void load8(const T* p, float (&o)[8]);
template <> __device__ __forceinline__ void load8<float>(const float* p, float (&o)[8]) {
  float4 a = __ldg(reinterpret_cast<const float4*>(p));
  float4 b = __ldg(reinterpret_cast<const float4*>(p) + 1);
  o[0] = a.x; o[1] = a.y; o[2] = a.z; o[3] = a.w; o[4] = b.x; o[5] = b.y; o[6] = b.z; o[7] = b.w;
}
template <> __device__ __forceinline__ void load8<__half>(const __half* p, float (&o)[8]) {
  uint4 u = __ldg(reinterpret_cast<const uint4*>(p));
  const __half2* h = reinterpret_cast<const __half2*>(&u);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    float2 f = __half22float2(h[i]);
    o[2 * i] = f.x; o[2 * i + 1] = f.y;
  }
}
template <> __device__ __forceinline__ void load8<__nv_bfloat16>(const __nv_bfloat16* p, float (&o)[8]) {
  uint4 u = __ldg(reinterpret_cast<const uint4*>(p));
  const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&u);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    float2 f = __bfloat1622float2(h[i]);
    o[2 * i] = f.x; o[2 * i + 1] = f.y;
  }
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// ---- programmatic dependent launch (sm_90) ----
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// Host: launches `kernel` on `stream`, as a programmatic dependent of the previous kernel in the
// stream when `pdl` (its griddepcontrol.wait then orders it after the primary's writes).
template <class... Params, class... Args>
inline void launch_kernel(void (*kernel)(Params...), dim3 grid, dim3 block, std::size_t smem,
                          cudaStream_t stream, bool pdl, Args&&... args) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = pdl ? 1 : 0;
  PUNICA_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...));
}

// Host: raises a kernel's dynamic shared-memory limit once per device (a process may drive several
// GPUs; the attribute is per device). Idempotent, so a race between threads is harmless.
template <class K>
inline void ensure_smem(K* kernel, std::size_t bytes, std::atomic<uint64_t>& done) {
  int dev = 0;
  PUNICA_CUDA_CHECK(cudaGetDevice(&dev));
  const uint64_t bit = uint64_t(1) << (dev & 63);
  if (done.load(std::memory_order_relaxed) & bit) return;
  PUNICA_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)));
  done.fetch_or(bit, std::memory_order_relaxed);
}

// Host: an int property of the current device, computed by `get(dev)` once per device (up to 64).
template <class F>
inline int per_device_cached(std::atomic<int>* cache, F&& get) {
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) {
    cudaGetLastError();
    return get(-1);
  }
  std::atomic<int>& c = cache[dev & 63];
  int v = c.load(std::memory_order_relaxed);
  if (v == 0) {
    v = get(dev);
    c.store(v, std::memory_order_relaxed);
  }
  return v;
}

// ---- async copies and tensor-core wrappers ----
__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
// 16-byte cp.async; src_bytes = 0 zero-fills the destination without reading src.
__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes)
               : "memory");
}
// The same with an L2 cache policy (createpolicy below) for the line it reads.
__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, int src_bytes, uint64_t policy) {
  asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2, %3;\n" ::"r"(dst), "l"(src),
               "r"(src_bytes), "l"(policy)
               : "memory");
}
// L2 eviction priorities for cp.async's cache hint. The prefill shrink reads each x element once:
// with evict_first its x lines are the first to go when L2 needs room, so the stream of x (tens of
// MB) does not push out what is read again (the A rows every token tile re-reads, the y rows the
// expand after the shrink reads and writes, e.g. just written by the base GEMM before a layer's
// LoRA part). Measured on the H200 (which of the two the gain comes from was not measured apart):
// results/NOTES.md v28 part 2.
__device__ __forceinline__ uint64_t l2_evict_first_policy() {
  uint64_t p;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(p));
  return p;
}
__device__ __forceinline__ uint64_t l2_evict_normal_policy() {
  uint64_t p;
  asm volatile("createpolicy.fractional.L2::evict_normal.b64 %0, 1.0;" : "=l"(p));
  return p;
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N> __device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}
// An ST-stage cp.async ring: the prologue loads stages 0..ST-2 (those below n) with one commit
// group each, empty groups included, so that cp_async_wait<ST - 2> means "stage it landed" in every
// iteration; ring_next advances a stage index.
template <int ST, class F>
__device__ __forceinline__ void ring_prologue(int n, F&& load) {
#pragma unroll
  for (int st = 0; st < ST - 1; ++st) {
    if (st < n) load(st);
    cp_async_commit();
  }
}
template <int ST>
__device__ __forceinline__ uint32_t ring_next(uint32_t s) { return s + 1 == ST ? 0 : s + 1; }
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
template <class T> struct MmaOp;
template <> struct MmaOp<__nv_bfloat16> {
  static __device__ __forceinline__ void run(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
};
template <> struct MmaOp<__half> {
  static __device__ __forceinline__ void run(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
};

// Shared-memory tile of rows x 64 16-bit elements (8 chunks of 16 bytes per row), chunk index
// XOR-swizzled with the row so that ldmatrix's 8 rows at one logical chunk hit 8 distinct banks.
__device__ __forceinline__ int swz(int row, int chunk) { return row * 8 + (chunk ^ (row & 7)); }

// ---- adapter tiles over the sorted-token metadata ----
// Active entry i (active_lora_ids[i] >= 0) owns ceil(num_tokens_per_lora[i] / bm) tiles; tiles are
// numbered consecutively over the entries. Finds the entry and the tile index inside it of the
// flat tile `flat`; false when `flat` is past the last tile. Whole warp, uniform arguments.
// with_none: the -1 entry's tokens form tiles too (shrink writes their zero rows).
// The entry's slot, token count and first position come back with it (TileRef): each lane loads its
// entry's three values at once, so a block's first token-id load waits for one round of metadata
// loads instead of a chain of them (slot -> count -> the entry's fields again -> start).
struct TileRef {
  int tile;   // the tile's index inside its entry
  int slot;   // active_lora_ids[entry] (-1: the no-adapter entry)
  int ntok;   // num_tokens_per_lora[entry]
  int start;  // lora_token_start_loc[entry]: the entry's first position in sorted_token_ids
  // This tile's rows (at most bm) and its first position in sorted_token_ids.
  __device__ __forceinline__ int rows(int bm) const { return min(bm, ntok - tile * bm); }
  __device__ __forceinline__ int first(int bm) const { return start + tile * bm; }
};
__device__ __forceinline__ bool find_tile(const LoraMetaView& m, int n_entries, int bm, int flat, TileRef& t,
                                          bool with_none = false) {
  const int lane = threadIdx.x & 31;
  int base = 0;
  for (int c = 0; c < n_entries; c += 32) {
    const int i = c + lane;
    int slot = -1, nt = 0, st = 0;
    if (i < n_entries) {  // three independent loads
      slot = m.active_lora_ids[i];
      nt = m.num_tokens_per_lora[i];
      st = m.lora_token_start_loc[i];
    }
    const int cnt = i < n_entries && (with_none || slot >= 0) ? (max(nt, 0) + bm - 1) / bm : 0;
    int incl = cnt;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      int v = __shfl_up_sync(0xffffffffu, incl, o);
      if (lane >= o) incl += v;
    }
    const int total = __shfl_sync(0xffffffffu, incl, 31);
    if (flat < base + total) {
      const unsigned hit = __ballot_sync(0xffffffffu, flat < base + incl);
      const int src = __ffs(hit) - 1;
      const int excl = __shfl_sync(0xffffffffu, incl - cnt, src);
      t.tile = flat - base - excl;
      t.slot = __shfl_sync(0xffffffffu, slot, src);
      t.ntok = __shfl_sync(0xffffffffu, nt, src);
      t.start = __shfl_sync(0xffffffffu, st, src);
      return true;
    }
    base += total;
  }
  return false;
}

// Token tiles of bm rows over the entries with an adapter (every lane of the warp gets the total).
__device__ __forceinline__ int count_tiles(const LoraMetaView& m, int n_entries, int bm) {
  const int lane = threadIdx.x & 31;
  int tot = 0;
  for (int i = lane; i < n_entries; i += 32)
    if (m.active_lora_ids[i] >= 0) tot += (max(m.num_tokens_per_lora[i], 0) + bm - 1) / bm;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) tot += __shfl_xor_sync(0xffffffffu, tot, o);
  return tot;
}

}  // namespace punica::kernels::lora_dev
