#!/usr/bin/env bash
# The standing check on the GPU machine (2×H200 host), in the two calls it needs (each under the
# device tool's 10 minutes), with the binaries of scripts/stage_device.sh (carry [".carry"]). Each
# part leaves one tarball per profile in OUTDIR, at most 3 files a call:
#   scripts/standing_check.sh OUTDIR a   quick + bench (q.tgz), full (f.tgz)
#   scripts/standing_check.sh OUTDIR b   layers with the Llama-3-70B filter (l.tgz), layers with the
#                                        Llama-3-8B filter (l8.tgz; its layers_ci JSON is the one
#                                        kept), the microbench (m.tgz)
# Until v25 part a also ran the 70B layers: 570 s of the 600 in NOTES v23 (q 213, f 198, l 158 s;
# part b 294 s with a microbench that then ran to its cap). Estimated now ~410 s and ~380 s (the
# microbench takes ~80 s since 1822444, NOTES v24-v25).
#   scripts/standing_check.sh OUTDIR s   on a 1-GPU machine: quick + bench (q.tgz) and full (f.tgz) in
#                                        one call, then part m in a second; install both folders
#                                        with install_results.py --keep l (the 2-GPU layer files
#                                        stay). Until v33 part s also ran the microbench (480 s in
#                                        v32); v33's copy baseline (a timed copy per case) and a
#                                        slower host took quick + bench + full alone to ~590 s, and
#                                        the microbench was cut at the 600 s limit
#   scripts/standing_check.sh OUTDIR m   the microbench alone (m.tgz, ~80 s)
#   scripts/standing_check.sh OUTDIR fm  full + the microbench (f.tgz, m.tgz; 376 s in NOTES v34): after part q, part
#                                        s's work in two calls with room under the limit (s alone is ~590 s)
#   scripts/standing_check.sh OUTDIR q   part a's quick + bench alone (q.tgz, ~190 s), for a call with
#                                        too little device time left for part a; install with
#                                        install_results.py --keep f (plus --keep m / l as for s)
#   scripts/standing_check.sh OUTDIR x   on a 4- or 8-GPU machine (issue 5): the layer scenarios under
#                                        mpirun -np <GPUs>, tp 1 to <GPUs>, with the 70B filter
#                                        (x70.tgz) and the 8B filter (x8.tgz; its layers_ci JSON is
#                                        the one kept); install with install_results.py --layers.
#                                        np 4 runs 1.5x and np 8 2x the np-2 cases (70B + 8B: ~230 s
#                                        on 2 GPUs): on 8 GPUs run parts x70 and x8 as two calls
# Back here, scripts/install_results.py DIR [DIR...] checks them and puts them under results/.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:?usage: standing_check.sh OUTDIR a|b|s|m|fm|q|x|x70|x8}
PART=${2:?usage: standing_check.sh OUTDIR a|b|s|m|fm|q|x|x70|x8}
mkdir -p "$OUT" || exit 2
export NCCL_NVLS_ENABLE=0
t0=$(date +%s)
status=0
one() {  # one NAME STEP_TIMEOUT [VAR=VALUE] PROFILE... : device_check.sh into OUT/NAME, then NAME.tgz
  local name=$1 cap=$2; shift 2
  local envs=()
  while [[ $# -gt 0 && "$1" == *=* ]]; do envs+=("$1"); shift; done
  env STEP_TIMEOUT="$cap" "${envs[@]}" scripts/device_check.sh "$OUT/$name" "$@" > "$OUT/$name.txt" 2>&1
  local rc=$?
  [ $rc -ne 0 ] && status=1
  tar -C "$OUT" -czf "$OUT/$name.tgz" "$name" "$name.txt" && rm -rf "${OUT:?}/$name" "$OUT/$name.txt"
  echo "[$(( $(date +%s) - t0 )) s] $name rc=$rc"
}
case "$PART" in
  a) one q 200 quick bench
     one f 170 full ;;
  # the microbench ran past a 150 s cap at 97e58c0 (78 of its 84 cases done; NOTES v23): 220 s.
  # The caps are per device_check.sh step (a layers profile is 3 steps), so they bound a step,
  # not the call: expected ~160 + ~140 + ~80 s.
  b) one l 190 LAYERS_FILTER='model=llama-3-70b' layers
     one l8 190 LAYERS_FILTER='model=llama-3-8b' layers
     one m 220 micro ;;
  q) one q 200 quick bench ;;
  s) one q 200 quick bench
     one f 170 full ;;
  m) one m 220 micro ;;
  fm) one f 170 full
      one m 220 micro ;;
  # tp 4 / 8 add cases to each step (2x H200: 70B 122 s, 8B 107 s in all): longer caps, still one call
  x|x70|x8)
     [ "$PART" != x8 ] && one x70 280 LAYERS_FILTER='model=llama-3-70b' layers
     [ "$PART" != x70 ] && one x8 280 LAYERS_FILTER='model=llama-3-8b' layers ;;
  *) echo "standing_check.sh: part '$PART' is not a, b, s, m, fm, q, x, x70 or x8" >&2; exit 2 ;;
esac
exit $status
