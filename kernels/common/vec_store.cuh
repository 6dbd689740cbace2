// One 16-byte global store that stays one instruction (st.global.v4). A plain
// `*reinterpret_cast<uint4*>(p) = v` of a value built from packed halves came out of the MoE group
// expand and the delta expands as four st.global.u32 (PTX / SASS at 54cb5c7 and ba9f6ab; ncu on the
// H100: global stores at 8 of 32 bytes per sector). CUDA's __stwb would do, but its "memory" clobber
// orders every other access around each store (ptxas: the delta grouped expand then spilled 12 bytes
// at its 80-register cap). Without the clobber the compiler may move other loads and stores across
// it, which is safe for the callers: each stores output that the same thread does not read back.
// Off the GPU (the CPU block emulator, scripts/lab/probes/block_emu) the emulator's __stwb, which
// checks the alignment.
#pragma once
// (uint4 / float4: nvcc declares them in every .cu; no include, so the emulator's macros stand)

namespace punica::kernels::vec {
__device__ __forceinline__ void st16(void* p, uint4 v) {
#if defined(__CUDA_ARCH__)
  asm volatile("st.global.v4.b32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w));
#else
  __stwb(reinterpret_cast<uint4*>(p), v);
#endif
}
__device__ __forceinline__ void st16(void* p, float4 v) {  // the same store of the floats' bits
#if defined(__CUDA_ARCH__)
  st16(p, make_uint4(__float_as_uint(v.x), __float_as_uint(v.y), __float_as_uint(v.z), __float_as_uint(v.w)));
#else
  __stwb(reinterpret_cast<float4*>(p), v);
#endif
}
__device__ __forceinline__ void st8(void* p, uint2 v) {  // one 8-byte store (st.global.v2)
#if defined(__CUDA_ARCH__)
  asm volatile("st.global.v2.b32 [%0], {%1, %2};" ::"l"(p), "r"(v.x), "r"(v.y));
#else
  __stwb(reinterpret_cast<uint2*>(p), v);
#endif
}
__device__ __forceinline__ void st8(void* p, float2 v) {  // the same store of the floats' bits
#if defined(__CUDA_ARCH__)
  st8(p, make_uint2(__float_as_uint(v.x), __float_as_uint(v.y)));
#else
  __stwb(reinterpret_cast<float2*>(p), v);
#endif
}
}  // namespace punica::kernels::vec
