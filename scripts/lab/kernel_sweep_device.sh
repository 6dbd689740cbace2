#!/usr/bin/env bash
# Kernel kinds ranked under the bench's own checks and timing (NOTES v34 part 4), on the GPU machine:
# one punica-bench binary, staged here with
#   scripts/lab/stage_ab.sh punica-bench main=HEAD
# run once per KIND under `--kernel OP=KIND` (`auto`: the automatic choice) over the cases FILTER
# selects, the kinds interleaved in each of REPS rounds (scripts/lab/ab_bench_device.sh, which this
# calls with the same SCENARIO / RUN_ARGS / STEP_TIMEOUT / DEADLINE environment), the result JSONs
# in OUTDIR/bench_ab.tgz. Back here, unpacked:
#   scripts/lab/ab_compare.py DIR auto KIND [KIND...] --best 0.05   (each kind's time over the automatic
#   choice's; --best: the cases where a kind is >= 5% faster, with the fastest kind both ways)
# A named kind runs in its general configuration (README.md, `--kernel`), so `auto` can beat them all.
#   scripts/lab/kernel_sweep_device.sh OUTDIR FILTER REPS shrink|expand KIND [KIND...]
# e.g. scripts/lab/kernel_sweep_device.sh OUT 'lora_shrink/.*ranks=64' 2 shrink auto fused fused_sk fused_wk fused_wg
# (carry [".carry/ab-bin.txz"]; SWEEP_BIN=NAME takes .carry/ab/bin/punica-bench_NAME, default main)
set -uo pipefail
OUT=${1:?usage: kernel_sweep_device.sh OUTDIR FILTER REPS shrink|expand KIND [KIND...]}
FILTER=${2:?filter}; REPS=${3:?reps}; OP=${4:?op}
shift 4
case "$OP" in shrink | expand) ;; *) echo "kernel_sweep_device.sh: OP is shrink or expand, not '$OP'" >&2; exit 2 ;; esac
[ $# -ge 1 ] || { echo "kernel_sweep_device.sh: name at least one KIND (auto for the automatic choice)" >&2; exit 2; }
mkdir -p .carry/ab && tar -C .carry/ab -xaf .carry/ab-bin.txz || { echo "kernel_sweep_device.sh: cannot unpack .carry/ab-bin.txz" >&2; exit 2; }
BASE=$(pwd)/.carry/ab/bin/punica-bench_${SWEEP_BIN:-main}
[ -x "$BASE" ] || { echo "kernel_sweep_device.sh: no binary $BASE (stage it: scripts/lab/stage_ab.sh punica-bench main=HEAD)" >&2; exit 2; }
for k in "$@"; do
  [[ "$k" =~ ^[a-z0-9_]+$ && "$k" != "${SWEEP_BIN:-main}" ]] || { echo "kernel_sweep_device.sh: '$k' is not a kernel kind" >&2; exit 2; }
  # a wrapper per kind: ab_bench_device.sh runs .carry/ab/bin/punica-bench_<name>; ab_unpack.sh's
  # re-extraction leaves it in place
  printf '#!/bin/sh\nexec %s "$@" --kernel %s=%s\n' "$BASE" "$OP" "$k" > ".carry/ab/bin/punica-bench_$k"
  chmod +x ".carry/ab/bin/punica-bench_$k"
done
exec "$(dirname "$0")/ab_bench_device.sh" "$OUT" "$FILTER" "$REPS" "$@"
