#!/usr/bin/env bash
# The GPU machine's side of a bench A/B: punica-bench binaries of several refs, staged here with
#   scripts/lab/stage_ab.sh punica-bench[,TEST...] NAME=REF [NAME=REF...]
# each run over the same cases REPS times, the variants interleaved in each round so that drift
# hits all alike; result JSON and logs in one tarball bench_ab.tgz in OUTDIR (the device tool
# returns 8 files at most). Compare afterwards here: unpack it and run
#   scripts/lab/ab_compare.py DIR BASE NEW [NEW...]   (medians over the rounds, ratios per op and tokens)
# or `punica-bench compare` / `targets` on single files.
#   scripts/lab/ab_bench_device.sh OUTDIR 'FILTER' REPS NAME [NAME...]      (carry [".carry/ab-bin.txz"])
# SCENARIO (default scenarios/bench_lora_ops.json; several files separated by spaces); RUN_ARGS (default --no-baselines --sample-rows 16)
# go to `run`: without --sample-rows the CPU checks every row, and the 8 Llama-3-8B prefill layer
# cases ran past a 90 s cap that they meet in ~30 s with 16 rows (NOTES v15: a call lost to that);
# MPI_NP=N runs each binary under `mpirun -np N` (the layer scenarios' tp > 1 cases).
# STEP_TIMEOUT (default 280 s) caps each run; a 120-case T=2048/8192 bench filter needs more than
# 80 s per run (NOTES v16 part 6: a call lost to a lower cap). DEADLINE=S: no run starts once S
# seconds have passed since this script began (a skipped run is reported), so that a call ends
# inside the device tool's limit instead of being cut; LIMIT=S (the call's limit, in the same
# seconds): no run starts that would end past S if it took as long as the longest run so far + 10%.
# OUTDIR holds only bench_ab.tgz, rewritten after every run (scripts/lab/ab_common.sh), so a call cut
# by the device tool's limit still returns every finished run.
set -uo pipefail
OUT=${1:?usage: ab_bench_device.sh OUTDIR FILTER REPS NAME [NAME...]}
FILTER=${2:-}; REPS=${3:?usage: ab_bench_device.sh OUTDIR FILTER REPS NAME [NAME...]}
[ -n "$FILTER" ] || { echo "ab_bench_device.sh: FILTER (argument 2) is empty: give a regex over case ids ('/' matches every case)" >&2; exit 2; }
shift 3
[ $# -ge 1 ] || { echo "ab_bench_device.sh: name at least one variant" >&2; exit 2; }
read -r -a SCENARIOS <<< "${SCENARIO:-scenarios/bench_lora_ops.json}"
LAUNCH=()
[ -n "${MPI_NP:-}" ] && LAUNCH=(mpirun --allow-run-as-root --bind-to none -x NCCL_NVLS_ENABLE=0 -x LD_LIBRARY_PATH -np "$MPI_NP")
source "$(dirname "$0")/ab_common.sh"
ab_begin "$OUT" bench_ab bench_ab.tgz
D=$AB_DIR
status=0
for rep in $(seq 1 "$REPS"); do
  for n in "$@"; do
    b=.carry/ab/bin/punica-bench_$n
    [ -x "$b" ] || { echo "ab_bench_device.sh: no binary $b" >&2; status=2; continue; }
    if ab_past_deadline "bench $n rep $rep"; then status=1; continue; fi
    t0=$(date +%s)
    timeout -k 10 "${STEP_TIMEOUT:-280}" "${LAUNCH[@]}" "$b" run --backend cuda -q ${RUN_ARGS:---no-baselines --sample-rows 16} -f "$FILTER" \
      -o "$D/${n}_$rep.json" --overwrite "${SCENARIOS[@]}" > "$D/${n}_$rep.log" 2>&1
    rc=$?
    # a run killed by its cap leaves no JSON (results are written at the end): say so, loudly
    rc_note=""
    if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then rc_note=" TIMED OUT at STEP_TIMEOUT=${STEP_TIMEOUT:-280} s, no result"; fi
    echo "bench $n rep $rep rc=$rc $(( $(date +%s) - t0 ))s$rc_note"; [ $rc -ne 0 ] && status=1
    ab_ran $(( $(date +%s) - t0 ))
    ab_pack || status=1
  done
done
ab_pack || status=1
exit $status
