#!/usr/bin/env bash
# The GPU machine's check-and-measure, in one command (DEVELOPERS: 10 minutes a call, 8 files out).
#   scripts/device_check.sh OUTDIR [quick|full|layers]
# quick : GPU unit tests, compute-sanitizer (memcheck/racecheck/initcheck) over the smoke scenario,
#         check --backend cuda on smoke + the CI kernel grid, and a timed subset of bench_lora_ops.
# full  : check every kernel scenario on the GPU (the full vLLM grid with --sample-rows), then the
#         whole bench_lora_ops.json and the model-shaped scenarios, result JSON per scenario.
# layers: mpirun -np <GPUs> over the layer scenarios (NCCL), result JSON.
# Binaries come from .carry/bin (scripts/stage_device.sh here) or PUNICA_BIN.
set -uo pipefail
OUT=${1:?usage: device_check.sh OUTDIR [quick|full|layers]}
PROFILE=${2:-quick}
BIN=${PUNICA_BIN:-.carry/bin}
PB=$BIN/punica-bench
export NCCL_NVLS_ENABLE=0
export LD_LIBRARY_PATH=$(pwd)/.carry/lib:${LD_LIBRARY_PATH:-}
mkdir -p "$OUT/logs"
status=0
step() {  # step NAME CMD... : run, log, remember failures, never stop the script
  local name=$1; shift
  local t0=$(date +%s)
  "$@" > "$OUT/logs/$name.log" 2>&1
  local rc=$?
  echo "$(date +%H:%M:%S) rc=$rc $(( $(date +%s) - t0 ))s $name" | tee -a "$OUT/logs/steps.txt"
  [ $rc -ne 0 ] && status=1
  return 0
}
nvidia-smi > "$OUT/logs/nvidia-smi.txt" 2>&1
$PB info > "$OUT/logs/info.txt" 2>&1
NGPU=$(nvidia-smi -L 2>/dev/null | wc -l)
case "$PROFILE" in
  quick)
    for t in "$BIN"/*_test; do [ -x "$t" ] && step "gtest_$(basename "$t")" "$t"; done
    for tool in memcheck racecheck initcheck; do
      step "sanitizer_$tool" compute-sanitizer --tool $tool --error-exitcode 9 $PB check --backend cuda -q scenarios/smoke.json
    done
    step check_smoke $PB check --backend cuda -o "$OUT/check_smoke.json" --overwrite scenarios/smoke.json
    step check_smoke_nan_padding $PB check --backend cuda -q --nan-padding scenarios/smoke.json
    step check_ci_grid $PB check --backend cuda -q scenarios/ci_kernel_grid.json
    step bench_quick $PB run --backend cuda -o "$OUT/bench_quick.json" --overwrite -f "${PUNICA_QUICK_FILTER:-H=4096}" scenarios/bench_lora_ops.json
    ;;
  full)
    step check_vllm_grid $PB check --backend cuda -q --sample-rows 64 -o "$OUT/check_vllm_grid.json" --overwrite scenarios/vllm_kernel_grid.json
    for s in smoke llama3_8b_decode llama3_8b_prefill; do
      step "check_$s" $PB check --backend cuda -q --sample-rows 256 scenarios/$s.json
    done
    step bench_lora_ops $PB run --backend cuda --sample-rows 128 -o "$OUT/bench_lora_ops.json" --overwrite scenarios/bench_lora_ops.json
    step bench_llama3_8b $PB run --backend cuda --sample-rows 128 -o "$OUT/bench_llama3_8b.json" --overwrite scenarios/llama3_8b_decode.json scenarios/llama3_8b_prefill.json
    ;;
  layers)
    MPI="mpirun --allow-run-as-root --bind-to none -x NCCL_NVLS_ENABLE=0 -x LD_LIBRARY_PATH -np $NGPU"
    step layers_ci $MPI $PB check --backend cuda -q -o "$OUT/layers_ci_np$NGPU.json" --overwrite scenarios/ci_layers.json
    step layers_llama $MPI $PB run --backend cuda --sample-rows 64 --iters 20 -o "$OUT/layers_llama_np$NGPU.json" --overwrite scenarios/layers_llama.json
    ;;
  *) echo "unknown profile $PROFILE" >&2; exit 2 ;;
esac
tar -C "$OUT" -czf "$OUT/logs.tgz" logs && rm -rf "$OUT/logs"
exit $status
