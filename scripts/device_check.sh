#!/usr/bin/env bash
# The GPU machine's check-and-measure, in one command (DEVELOPERS: 10 minutes a call, 8 files out).
#   scripts/device_check.sh OUTDIR PROFILE [PROFILE...]     (each step capped at STEP_TIMEOUT s)
# quick : GPU unit tests, compute-sanitizer (memcheck/racecheck/initcheck) over the built-in
#         scenario (every op, decode + prefill), check --backend cuda on smoke (+ NaN padding) and
#         the CI kernel grid.
# bench : the whole bench_lora_ops.json timed (result JSON).
# full  : the full vLLM kernel grid checked (--sample-rows, 12 parallel shards -> check_vllm_grid.tgz),
#         the model-shaped scenarios timed.
# layers: mpirun -np <GPUs> over the layer scenarios (NCCL), the MoE layer's included, result JSON.
# moe_quick: the MoE and delta kernels' part of quick alone (GPU tests, sanitizers, CI scenarios).
# moe   : bench_moe.json timed, decode and prefill apart (issue 44's MoE ops, 2 result JSONs).
# moe_delta: bench_moe_delta.json timed, decode and prefill apart (FlashInfer's MoE LoRA deltas, 2 result JSONs).
# moe_grid: vLLM's MoE LoRA test matrices (vllm_moe_grid.json, SPEC 6.3-6.4) checked, as in full, alone
#         (check_vllm_moe_grid.json): the MoE kernels' GPU correctness without full's dense grid.
# offgrid_ab: the expand cases of bench_offgrid.json above rank 64 (128, 256, 512 and the mixed sets)
#         under --kernel expand=auto / stream / pipe (3 result JSONs).
# micro : punica-microbench over the H=4096 T=1 and T=8192 bench cases (Google Benchmark JSON,
#         microbench_h200.json, and its stderr); MICRO_FILTER replaces the case filter.
# Env: STEP_TIMEOUT (each step's cap, s), BUDGET_S (the whole call's, s; steps past it are skipped),
# QUICK_SCENARIO_SANITIZERS=0 (quick without the three sanitizer passes over the built-in scenario,
# whose dense kernels a change elsewhere leaves as they were measured).
# Binaries come from .carry/punica-bin.txz (or .tgz) or .carry/bin (scripts/stage_device.sh here) or PUNICA_BIN.
set -uo pipefail
OUT=${1:?usage: device_check.sh OUTDIR PROFILE [PROFILE...] (quick bench full offgrid offgrid_ab moe_quick moe moe_delta moe_grid micro layers)}
shift
PROFILES=${*:-quick}
STEP_TIMEOUT=${STEP_TIMEOUT:-300}
# BUDGET_S: the whole call's seconds (the device tool's 10-minute cap): each step's cap shrinks to
# what is left, and a step that cannot get MIN_STEP_S seconds is skipped (logged, and the exit
# status says so), so that the logs and result files of the steps that ran always come back.
BUDGET_S=${BUDGET_S:-0}
MIN_STEP_S=${MIN_STEP_S:-20}
T_START=$(date +%s)
# stage_device.sh ships the binaries as one tarball: unpack it once.
if [ -z "${PUNICA_BIN:-}" ] && [ ! -d .carry/bin ]; then
  for tb in .carry/punica-bin.txz .carry/punica-bin.tgz; do
    [ -f "$tb" ] || continue
    tar -C .carry -xaf "$tb" 2>/dev/null ||
      python3 -c "import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])" "$tb" .carry ||
      { echo "cannot unpack $tb" >&2; exit 2; }
    break
  done
fi
BIN=${PUNICA_BIN:-.carry/bin}
PB=$BIN/punica-bench
export NCCL_NVLS_ENABLE=0
export LD_LIBRARY_PATH=$(pwd)/.carry/lib:${LD_LIBRARY_PATH:-}
mkdir -p "$OUT/logs"
status=0
step() {  # step NAME CMD... : run, log, remember failures, never stop the script
  local name=$1; shift
  local t0=$(date +%s) cap=$STEP_TIMEOUT
  if [ "$BUDGET_S" -gt 0 ]; then
    local left=$(( BUDGET_S - (t0 - T_START) - 15 ))  # 15 s kept for the logs' tarball
    if [ "$left" -lt "$MIN_STEP_S" ]; then
      echo "$(date +%H:%M:%S) skip $name: ${left}s of BUDGET_S=$BUDGET_S left" | tee -a "$OUT/logs/steps.txt"
      status=1
      return 0
    fi
    [ "$left" -lt "$cap" ] && cap=$left
  fi
  timeout -k 10 "$cap" "$@" > "$OUT/logs/$name.log" 2>&1
  local rc=$?
  echo "$(date +%H:%M:%S) rc=$rc $(( $(date +%s) - t0 ))s $name" | tee -a "$OUT/logs/steps.txt"
  [ $rc -ne 0 ] && status=1
  return 0
}
nvidia-smi > "$OUT/logs/nvidia-smi.txt" 2>&1
$PB info > "$OUT/logs/info.txt" 2>&1
NGPU=$(nvidia-smi -L 2>/dev/null | wc -l)
# The MoE kernels under the sanitizers, on their odd-shape cases, the one call's split-K shrink (its
# tickets) and the w13 -> w2 chain; FlashInfer's deltas likewise (quick and moe_quick).
moe_checks() {
  for tool in memcheck racecheck initcheck; do
    step "sanitizer_moe_$tool" compute-sanitizer --tool $tool --error-exitcode 9 "$BIN/fused_moe_lora_test" \
      --gtest_filter='Cases/FusedMoeLoraOdd.MatchesReference/fused?:AddLoraW13W2.*:Cases/FusedMoeLoraTiles.MatchesReference/splitk*'
    step "sanitizer_moe_align_$tool" compute-sanitizer --tool $tool --error-exitcode 9 "$BIN/moe_lora_align_test" \
      --gtest_filter='Cases/MoeLoraAlign.HoldsTheOrderFreeContract/odd?:MoeLoraAlignEdge.*'
    # FlashInfer's MoE LoRA deltas (issue 45): both paths, both gemm1 modes, gemm2, odd shapes
    step "sanitizer_moe_delta_$tool" compute-sanitizer --tool $tool --error-exitcode 9 "$BIN/bgmv_moe_lora_delta_test" \
      --gtest_filter='BgmvMoeGemm1.FlashInferShapes:BgmvMoeGemm1.DtypesStrideZeroExpertsTileHeights:BgmvMoeGemm1.EmptyBatch:BgmvMoeGemm1.ExpandTilesCrossSlices:BgmvMoeGemm2.DtypesStrideZeroExperts'
    # the grouped path's K splits (odd K, a partial last split) and column splits
    [ $tool = memcheck ] && step "sanitizer_moe_delta_splits_$tool" compute-sanitizer --tool $tool --error-exitcode 9 \
      "$BIN/bgmv_moe_lora_delta_test" --gtest_filter='BgmvMoeGemm1.OddShapesBothPaths:BgmvMoeGemm2.ShapesAndPaths'
    step "sanitizer_moe_delta_bench_$tool" compute-sanitizer --tool $tool --error-exitcode 9 $PB check --backend cuda -q \
      scenarios/ci_moe_delta.json
  done
}
for PROFILE in $PROFILES; do
case "$PROFILE" in
  quick)
    for t in "$BIN"/*_test; do [ -x "$t" ] && step "gtest_$(basename "$t")" "$t"; done
    if [ "${QUICK_SCENARIO_SANITIZERS:-1}" != 0 ]; then
      for tool in memcheck racecheck initcheck; do
        step "sanitizer_$tool" compute-sanitizer --tool $tool --error-exitcode 9 $PB check --backend cuda -q
      done
    fi
    # the pipelined expand's kernels (rank 128 included) forced at decode-sized batches, and the
    # streaming kernel's two-chunk form (ranks above 64) in its three tile heights
    for tool in memcheck racecheck initcheck; do
      step "sanitizer_expand_$tool" compute-sanitizer --tool $tool --error-exitcode 9 "$BIN/lora_expand_test" \
        --gtest_filter='LoraExpand.PrefillKernelsSmallBatch:LoraExpand.StreamTwoChunks'
    done
    moe_checks
    step check_smoke $PB check --backend cuda -o "$OUT/check_smoke.json" --overwrite scenarios/smoke.json
    step check_smoke_nan_padding $PB check --backend cuda -q --nan-padding scenarios/smoke.json
    # every shrink / expand kind that --kernel can name, each over the smoke scenario with NaN padding
    # (the kinds the automatic choice never takes at those shapes included)
    step check_smoke_kernels bash -c 'for k in legacy fused fused_nosplit fused_sk fused128_sk fused_wk fused_wg cluster; do
        '"$PB"' check --backend cuda -q --nan-padding --kernel shrink=$k -f lora_shrink scenarios/smoke.json || exit 1; done
      for k in staged stream pipe; do
        '"$PB"' check --backend cuda -q --nan-padding --kernel expand=$k -f lora_expand scenarios/smoke.json || exit 1; done'
    step check_ci_grid $PB check --backend cuda -q scenarios/ci_kernel_grid.json
    # every plan the automatic choice can return (plan_coverage_test), NaN padding on
    step check_plan_reach $PB check --backend cuda -q --nan-padding scenarios/ci_plan_reach.json
    step check_ci_moe $PB check --backend cuda -q --nan-padding scenarios/ci_moe.json
    step check_ci_moe_delta $PB check --backend cuda -q --nan-padding scenarios/ci_moe_delta.json
    ;;
  moe_quick)
    # the MoE and delta kernels alone: their GPU tests, sanitizers and CI scenarios (NaN padding)
    for t in fused_moe_lora_test moe_lora_align_test bgmv_moe_lora_delta_test; do step "gtest_$t" "$BIN/$t"; done
    moe_checks
    step check_ci_moe $PB check --backend cuda -q --nan-padding scenarios/ci_moe.json
    step check_ci_moe_delta $PB check --backend cuda -q --nan-padding scenarios/ci_moe_delta.json
    ;;
  moe)
    # issue 44: the MoE LoRA ops (alignment, fused, add_lora_w13 / w2) on the model presets, timed,
    # decode (T <= 64) and prefill (T 512, 4096) apart: each step its own time cap and result file
    step bench_moe_decode $PB run --backend cuda --sample-rows 64 -f '/num_requests=(1|16|64)/' \
      -o "$OUT/bench_moe_decode.json" --overwrite scenarios/bench_moe.json
    step bench_moe_prefill $PB run --backend cuda --sample-rows 64 -f '/num_requests=(512|4096)/' \
      -o "$OUT/bench_moe_prefill.json" --overwrite scenarios/bench_moe.json
    ;;
  moe_delta)
    # issue 45: FlashInfer's MoE LoRA deltas on the MoE presets, decode and prefill, timed
    # (decode and prefill apart: each step has its own time cap and result file)
    step bench_moe_delta_decode $PB run --backend cuda --iters 30 --warmup 5 --sample-rows 64 -f '/num_requests=(1|4|16|64)/' \
      -o "$OUT/bench_moe_delta_decode.json" --overwrite scenarios/bench_moe_delta.json
    step bench_moe_delta_prefill $PB run --backend cuda --iters 30 --warmup 5 --sample-rows 64 -f '/num_requests=(512|4096)/' \
      -o "$OUT/bench_moe_delta_prefill.json" --overwrite scenarios/bench_moe_delta.json
    ;;
  moe_grid)
    step check_vllm_moe_grid $PB check --backend cuda -q --sample-rows 64 -o "$OUT/check_vllm_moe_grid.json" --overwrite \
      scenarios/vllm_moe_grid.json
    ;;
  bench)
    step bench_lora_ops $PB run --backend cuda --iters 30 --warmup 5 --sample-rows 128 -o "$OUT/bench_lora_ops.json" --overwrite scenarios/bench_lora_ops.json
    ;;
  full)
    # The vLLM grid (1680 cases, hidden up to 128256: the CPU reference dominates) in 12 parallel
    # shards of 140 cases, op x dtype x slice count, spread over the GPUs; one process took > 150 s
    # and 8 shards (2-3 slices together) still ran past 72 s.
    NG=$(( NGPU > 0 ? NGPU : 1 ))
    i=0
    for op in lora_shrink lora_expand; do for dt in bf16 fp16; do for ns in 1 2 3; do
      ( step "check_vllm_grid_$i" env CUDA_VISIBLE_DEVICES=$((i % NG)) $PB check --backend cuda -q --sample-rows 64 \
          -f "$op/.*num_slices=$ns/.*dtype=$dt/" -o "$OUT/check_vllm_grid_$i.json" --overwrite scenarios/vllm_kernel_grid.json ) &
      i=$((i + 1))
    done; done; done
    wait
    grep -q "rc=[1-9][0-9]* .*check_vllm_grid_" "$OUT/logs/steps.txt" && status=1
    # One file back instead of eight (the device tool returns at most 8).
    ( cd "$OUT" && ls check_vllm_grid_*.json >/dev/null 2>&1 && tar -czf check_vllm_grid.tgz check_vllm_grid_*.json && rm -f check_vllm_grid_*.json )
    for s in smoke llama3_8b_decode llama3_8b_prefill; do
      step "check_$s" $PB check --backend cuda -q --sample-rows 256 scenarios/$s.json
    done
    # vLLM's MoE LoRA test matrices (SPEC 6.3-6.4), 113 cases
    step check_vllm_moe_grid $PB check --backend cuda -q --sample-rows 64 scenarios/vllm_moe_grid.json
    step bench_llama3_8b $PB run --backend cuda --sample-rows 128 -o "$OUT/bench_llama3_8b.json" --overwrite scenarios/llama3_8b_decode.json scenarios/llama3_8b_prefill.json
    # Few adapters in many slots (max_loras 32, 1-8 adapters in the batch; NOTES v27 part 2), 162 cases
    step bench_sparse_slots $PB run --backend cuda --sample-rows 64 -o "$OUT/bench_sparse_slots.json" --overwrite scenarios/bench_sparse_slots.json
    ;;
  offgrid)
    # issue 47: ranks 8-512 and mixed sets, shapes and token counts off the tuned grid, 504 cases in
    # two steps of 252 (one step of all 504 ran past its 300 s cap at case 497 on the H200)
    step bench_offgrid_a $PB run --backend cuda --sample-rows 64 -f '^(down_14336|llama_gate_up)/' \
      -o "$OUT/bench_offgrid_a.json" --overwrite scenarios/bench_offgrid.json
    step bench_offgrid_b $PB run --backend cuda --sample-rows 64 -f '^(qwen_qkv|wide_5120)/' \
      -o "$OUT/bench_offgrid_b.json" --overwrite scenarios/bench_offgrid.json
    ;;
  offgrid_ab)
    # issue 47's big-rank expand (ranks 128, 256, 512, 8/32/128, 16/64/256/512) three ways: the
    # automatic choice and the streaming kernel forced (two rank chunks above rank 64) over all of
    # them, the pipelined kernel forced (RK = 128) where it applies (ranks <= 128) at every token count
    for k in auto stream pipe; do
      R='128|256|512|8x32x128|16x64x256x512'
      [ $k = pipe ] && R='128|8x32x128'
      step offgrid_expand_$k $PB run --backend cuda --sample-rows 64 --kernel expand=$k \
        -f "/lora_expand/.*/ranks=($R)/" -o "$OUT/offgrid_expand_$k.json" --overwrite scenarios/bench_offgrid.json
    done
    ;;
  micro)
    # Its own step (and timeout): as a bare command in a call it once ran past a 90 s cap.
    MB=$BIN/punica-microbench
    if [ -x "$MB" ]; then
      step microbench sh -c '"$0" --case-filter="$1" --benchmark_min_time=0.1 --benchmark_out="$2" \
        --benchmark_out_format=json > /dev/null 2> "$3"' "$MB" "${MICRO_FILTER:-hidden=4096/.*num_requests=(1|8192)/}" \
        "$OUT/microbench_h200.json" "$OUT/microbench_h200_stderr.txt"
    else
      echo "$(date +%H:%M:%S) skip microbench: no $MB" | tee -a "$OUT/logs/steps.txt"
    fi
    ;;
  layers)
    MPI="mpirun --allow-run-as-root --bind-to none -x NCCL_NVLS_ENABLE=0 -x LD_LIBRARY_PATH -np $NGPU"
    # Every layer kind, plain and fully sharded, checked and timed (small shapes).
    step layers_ci $MPI $PB run --backend cuda -q --iters 20 -o "$OUT/layers_ci_np$NGPU.json" --overwrite scenarios/ci_layers.json scenarios/ci_layers_edge.json
    # Model-shaped layers with tp <= GPUs present (larger tp would only be skips), prefill and
    # decode in separate result files so that one slow step cannot lose the other.
    TPS=$(seq -s '|' 1 $NGPU | sed 's/|$//')
    # LAYERS_FILTER narrows the cases (e.g. 'model=llama-3-70b', whose CPU reference is slow enough
    # to want its own call); a phase without a matching case is skipped, not failed.
    for ph in prefill decode; do
      F="^${ph}_.*${LAYERS_FILTER:-}.*/tp=(${TPS})/"
      if ! $PB list -f "$F" scenarios/layers_llama.json 2>/dev/null | grep -q .; then
        echo "$(date +%H:%M:%S) skip layers_llama_$ph: no case matches $F" | tee -a "$OUT/logs/steps.txt"
        continue
      fi
      step layers_llama_$ph $MPI $PB run --backend cuda --sample-rows 16 --iters 20 -f "$F" \
        -o "$OUT/layers_llama_${ph}_np$NGPU.json" --overwrite scenarios/layers_llama.json
    done
    # The MoE LoRA layer (issue 46): its CI scenario checked (tp <= GPUs, NaN padding), then the model
    # presets (Mixtral-8x7B, Qwen3-30B-A3B, DeepSeek-V2-Lite) timed at tp <= GPUs, prefill T = 4096 and
    # decode T = 64 each its own step; MOE_LAYERS_FILTER narrows them (e.g. 'mixtral').
    step moe_layer_ci $MPI $PB check --backend cuda -q --nan-padding -f "/tp=(${TPS})/" scenarios/ci_moe_layer.json
    # its new kernels (kernels/moe_base) and the layer's buffers under memcheck, tp 1 cases (seconds)
    step moe_layer_memcheck compute-sanitizer --tool memcheck --error-exitcode 9 $PB check --backend cuda -q \
      -f '/tp=1/' scenarios/ci_moe_layer.json
    for ph in prefill decode; do
      F="^${ph}_.*${MOE_LAYERS_FILTER:-}.*/tp=(${TPS})/"
      step moe_layers_$ph $MPI $PB run --backend cuda --sample-rows 16 --iters 20 -f "$F" \
        -o "$OUT/moe_layers_${ph}_np$NGPU.json" --overwrite scenarios/moe_layers.json
    done
    ;;
  *) echo "unknown profile $PROFILE" >&2; exit 2 ;;
esac
done
tar -C "$OUT" -czf "$OUT/logs.tgz" logs && rm -rf "$OUT/logs"
exit $status
