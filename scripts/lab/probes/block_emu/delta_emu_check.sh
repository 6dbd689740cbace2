#!/usr/bin/env bash
# Runs the FlashInfer MoE LoRA delta kernels (kernels/bgmv_moe_lora_delta, over the emulated
# moe_lora_align) on the CPU through block_emu.h + delta_emu.h (mma.sync emulated per warp) and checks
# them against the Eigen reference (delta_emu_check.cpp): both paths, both gemm1 modes, gemm2, odd
# shapes, NaN padding. A check of the kernels' logic where no GPU is at hand, not a GPU test.
source "$(dirname "$0")/emu_env.sh"
python3 scripts/lab/probes/block_emu/emulate_kernel.py kernels/moe_lora_align/moe_lora_align.cu "$W/moe_lora_align.cpp"
python3 scripts/lab/probes/block_emu/launch_lambdas.py kernels/bgmv_moe_lora_delta/bgmv_moe_lora_delta.cu "$W/delta.cu"
python3 scripts/lab/probes/block_emu/emulate_kernel.py "$W/delta.cu" "$W/delta.cpp"
sed -i -e 's|#include "kernels/add_lora_embedding/lora_elem.cuh"|#include "scripts/lab/probes/block_emu/delta_emu.h"|' \
  -e 's|#include "kernels/lora_shrink/lora_device.cuh"||' \
  -e 's|extern static __align__(16) unsigned char smem\[\];|unsigned char* smem = ::emu::dyn_smem<unsigned char>();|' \
  -e 's|__host__ __device__ constexpr|constexpr|g' -e 's|static __align__(16)|static|g' "$W/delta.cpp"
for f in moe_lora_align delta; do
  g++ -O0 $SAN -std=c++17 -w $INC -c "$W/$f.cpp" -o "$W/$f.o"
done
g++ -O2 $SAN -std=c++17 -w $INC scripts/lab/probes/block_emu/delta_emu_check.cpp "$W"/*.o reference/bgmv_moe_reference.cpp \
  kernels/common/check.cpp "$CUDA/lib64/libcudart_static.a" -ldl -lpthread -lrt -o "$W/delta_emu_check"
ASAN_OPTIONS=detect_leaks=0 "$W/delta_emu_check" "$@"
