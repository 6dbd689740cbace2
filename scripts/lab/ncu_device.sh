#!/usr/bin/env bash
# The GPU machine's profile of chosen cases: each NAME=FILTER case of SCENARIO checked once by
# `punica-bench check --backend cuda` under `ncu --set full` at the GPU's own clocks
# (--clock-control none: the clocks the suite's timings run at), then the SASS of every kernel ncu
# profiled (cuobjdump -sass -fun) and a table of them all (scripts/lab/ncu_summary.py).
#   scripts/lab/ncu_device.sh OUTDIR NAME=FILTER [NAME=FILTER...]      (carry [".carry"]: scripts/stage_device.sh)
# FILTER is a regex over case ids, as `check -f` takes it; NAME names the report (letters, digits, _ . -).
# SCENARIO (default scenarios/bench_lora_ops.json); KERNELS: ncu's kernel-name regex (default
# 'shrink|expand': the ops' kernels and the shrink's zero kernel, not the metadata kernels); LAUNCHES
# (default 6): launches profiled per case; NCU_SET (default full); STEP_TIMEOUT (default 150 s) caps
# each case; LIMIT=S (the device call's limit): no case starts that would end past S if it took as
# long as the longest case so far + 10%; DEADLINE=S: none starts after S s (scripts/lab/ab_common.sh).
# PB, NCU, CUOBJDUMP name the binaries (defaults: the staged .carry/bin/punica-bench, unpacked from
# .carry/punica-bin.txz when absent; ncu; cuobjdump).
# OUTDIR holds one tarball, ncu.tgz (ncu/NAME.txt, sass/*.sass + sass/index.txt, summary.txt,
# summary.json, gpu.txt, skipped.txt when LIMIT or DEADLINE skipped a case), rewritten after every
# case, so that a call cut at its limit still returns every finished case. Exit 0 when every case ran, 1 when one
# failed or was skipped, 2 on a usage error.
set -uo pipefail
OUT=${1:?usage: ncu_device.sh OUTDIR NAME=FILTER [NAME=FILTER...]}
shift
[ $# -ge 1 ] || { echo "ncu_device.sh: name at least one NAME=FILTER case" >&2; exit 2; }
for c in "$@"; do
  n=${c%%=*} f=${c#*=}
  if [ "$n" = "$c" ] || [ -z "$f" ] || ! [[ "$n" =~ ^[A-Za-z0-9_.-]+$ ]]; then
    echo "ncu_device.sh: '$c' is not NAME=FILTER (NAME of letters, digits, _ . -; FILTER a regex over case ids)" >&2
    exit 2
  fi
done
HERE=$(cd "$(dirname "$0")" && pwd)
SCENARIO=${SCENARIO:-scenarios/bench_lora_ops.json}
KERNELS=${KERNELS:-shrink|expand}
NCU=${NCU:-ncu}
CUOBJDUMP=${CUOBJDUMP:-cuobjdump}
if [ -z "${PB:-}" ]; then
  PB=.carry/bin/punica-bench
  if [ ! -x "$PB" ] && [ -f .carry/punica-bin.txz ]; then
    tar -C .carry -xaf .carry/punica-bin.txz || { echo "ncu_device.sh: cannot unpack .carry/punica-bin.txz" >&2; exit 2; }
  fi
  # the staged libraries (scripts/stage_device.sh), also when an earlier call on this machine unpacked them
  [ -d .carry/lib ] && export LD_LIBRARY_PATH=$(pwd)/.carry/lib:${LD_LIBRARY_PATH:-}
fi
[ -x "$PB" ] || { echo "ncu_device.sh: no punica-bench at $PB (run scripts/stage_device.sh here and carry .carry)" >&2; exit 2; }
[ -f "$SCENARIO" ] || { echo "ncu_device.sh: no scenario file $SCENARIO" >&2; exit 2; }
source "$HERE/ab_common.sh"  # the work folder, the tarball rewritten after each case, DEADLINE / LIMIT
ab_work "$OUT" ncu_run ncu.tgz
D=$AB_DIR
mkdir -p "$D/ncu" "$D/sass"
{ "$PB" --version; nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv; "$NCU" --version; } \
  > "$D/gpu.txt" 2>&1
status=0
for c in "$@"; do
  n=${c%%=*} f=${c#*=}
  if ab_past_deadline "$n"; then status=1; continue; fi
  t0=$(date +%s)
  timeout -k 5 "${STEP_TIMEOUT:-150}" "$NCU" --set "${NCU_SET:-full}" --clock-control none \
    --kernel-name "regex:$KERNELS" --launch-count "${LAUNCHES:-6}" --import-source no --print-kernel-base mangled \
    "$PB" check --backend cuda -q --sample-rows 16 -f "$f" "$SCENARIO" > "$D/ncu/$n.txt" 2>&1
  rc=$?
  t=$(( $(date +%s) - t0 ))
  ab_ran "$t"
  echo "$n rc=$rc ${t} s"
  [ $rc -ne 0 ] && status=1
  # the SASS of each kernel this case profiled, once per kernel over the call
  grep -ho '^  _Z[A-Za-z0-9_]*' "$D/ncu/$n.txt" | sed 's/^  //' | sort -u | while read -r k; do
    h=$(printf '%s' "$k" | md5sum | cut -c1-12)
    [ -f "$D/sass/$h.sass" ] && continue
    "$CUOBJDUMP" -sass -fun "$k" "$PB" > "$D/sass/$h.sass" 2>&1 || echo "cuobjdump failed for $k" >> "$D/sass/errors.txt"
    echo "$h $k" >> "$D/sass/index.txt"
  done
  ab_pack || status=1
done
reports=()
# the reports with at least one launch (a case that failed before its first kernel has none)
for c in "$@"; do grep -q '), Context ' "$D/ncu/${c%%=*}.txt" 2>/dev/null && reports+=("$D/ncu/${c%%=*}.txt"); done
if [ ${#reports[@]} -gt 0 ]; then
  python3 "$HERE/ncu_summary.py" "${reports[@]}" --json "$D/summary.json" > "$D/summary.txt" 2>&1 || status=1
fi
ab_pack || status=1
exit $status
