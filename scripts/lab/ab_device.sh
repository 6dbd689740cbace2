#!/usr/bin/env bash
# The GPU machine's side of scripts/lab/stage_ab.sh: every variant's correctness tests once, then the
# gtest FILTER (perf tests) REPS times, variants interleaved in each round so that drift hits all
# alike; logs and one tarball ab.tgz in OUTDIR (the device tool returns 8 files at most).
#   scripts/lab/ab_device.sh OUTDIR TARGET FILTER REPS NAME [NAME...]
# CORRECT_FILTER (default '*'; the disabled perf tests are not run by it) selects the tests run once.
# DEADLINE=S: no perf run starts once S seconds have passed since this script began. OUTDIR holds
# only ab.tgz, rewritten after every run (scripts/lab/ab_common.sh), so a call cut by the device tool's
# limit still returns what finished.
set -uo pipefail
OUT=${1:?usage: ab_device.sh OUTDIR TARGET FILTER REPS NAME [NAME...]}
TARGET=${2:?target}; FILTER=${3:?gtest filter}; REPS=${4:?reps}
shift 4
[ $# -ge 1 ] || { echo "ab_device.sh: name at least one variant" >&2; exit 2; }
source "$(dirname "$0")/ab_common.sh"
ab_begin "$OUT" logs ab.tgz
L=$AB_DIR
status=0
for n in "$@"; do
  b=.carry/ab/bin/${TARGET}_$n
  [ -x "$b" ] || { echo "ab_device.sh: no binary $b" >&2; status=2; continue; }
  timeout -k 10 300 "$b" --gtest_filter="${CORRECT_FILTER:-*}" > "$L/correct_$n.txt" 2>&1
  rc=$?; echo "correct $n rc=$rc"; [ $rc -ne 0 ] && status=1
  ab_pack || status=1
done
for rep in $(seq 1 "$REPS"); do
  for n in "$@"; do
    if ab_past_deadline "perf $n rep $rep"; then status=1; continue; fi
    t0=$(date +%s)
    timeout -k 10 300 ".carry/ab/bin/${TARGET}_$n" --gtest_also_run_disabled_tests --gtest_filter="$FILTER" \
      > "$L/perf_${n}_$rep.txt" 2>&1
    rc=$?; echo "perf $n rep $rep rc=$rc"; [ $rc -ne 0 ] && status=1
    ab_ran $(( $(date +%s) - t0 ))
    ab_pack || status=1
  done
done
ab_pack || status=1
exit $status
