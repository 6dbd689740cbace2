#!/usr/bin/env bash
# The GPU machine's setup shared by scripts/lab/ab_device.sh and scripts/lab/ab_bench_device.sh: unpacks
# .carry/ab-bin.txz (scripts/lab/stage_ab.sh) into .carry/ab and records, in LOGDIR, which commit each
# variant is (refs.txt) and the GPU's name, clocks and temperature at the start (gpu.txt).
#   scripts/lab/ab_unpack.sh LOGDIR
set -uo pipefail
LOG=${1:?usage: ab_unpack.sh LOGDIR}
mkdir -p "$LOG" .carry/ab
tar -C .carry/ab -xaf .carry/ab-bin.txz || { echo "ab_unpack.sh: cannot unpack .carry/ab-bin.txz" >&2; exit 2; }
cp .carry/ab/refs.txt "$LOG/refs.txt"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv > "$LOG/gpu.txt" 2>&1
exit 0
