#!/usr/bin/env bash
# Runs the MoE LoRA kernels (kernels/moe_lora_align, kernels/fused_moe_lora) on the CPU through
# block_emu.h and checks them against the Eigen reference (moe_emu_check.cpp): a check of the
# kernels' logic where no GPU is at hand, not a GPU test. ASAN=1 adds AddressSanitizer (the kernels'
# out-of-bounds reads and writes: memcheck's job). An argument adds a vLLM-sized case (slow).
source "$(dirname "$0")/emu_env.sh"
for k in fused_moe_lora/fused_moe_lora moe_lora_align/moe_lora_align; do
  python3 scripts/lab/probes/block_emu/emulate_kernel.py kernels/$k.cu "$W/$(basename $k).cpp"
  # -O0: the emulated shared memory (function statics the compiler sees no one else write) must be
  # reloaded after every barrier, which optimised code does not do
  g++ -O0 $SAN -std=c++17 -w $INC -c "$W/$(basename $k).cpp" -o "$W/$(basename $k).o"
done
g++ -O2 $SAN -std=c++17 -w $INC scripts/lab/probes/block_emu/moe_emu_check.cpp "$W"/*.o reference/moe_reference.cpp \
  reference/naive_moe_reference.cpp kernels/common/check.cpp "$CUDA/lib64/libcudart_static.a" -ldl -lpthread -lrt -o "$W/moe_emu_check"
ASAN_OPTIONS=detect_leaks=0 "$W/moe_emu_check" "$@"
