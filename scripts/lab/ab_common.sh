# Sourced by scripts/lab/ab_bench_device.sh and scripts/lab/ab_device.sh (the GPU machine's A/B drivers) and
# scripts/lab/ncu_device.sh:
# their runs live in a work folder outside OUTDIR, and OUTDIR holds one tarball, rewritten
# atomically after every run, so a call cut by the device tool's limit still returns every finished
# run (it returns 8 files at most: NOTES v28 part 5 lost a call to 22 loose files). DEADLINE=S (env):
# no run starts once S seconds have passed since ab_begin. LIMIT=S (env; the device call's own limit,
# counted from ab_begin): no run starts that would end past S if it took as long as the longest run
# so far plus 10% (NOTES v37: a ~106 s run started at 322 s of a 420 s call was cut with it).
#   ab_begin OUTDIR NAME TGZ  makes WORK (removed at exit), unpacks the binaries (ab_unpack.sh) with
#                             its logs into $WORK/NAME (also $AB_DIR), writes OUTDIR/TGZ; exit 2 on error
#   ab_work OUTDIR NAME TGZ   the same without unpacking anything or writing TGZ (scripts/lab/ncu_device.sh)
#   ab_pack                   rewrites OUTDIR/TGZ from $WORK/NAME
#   ab_past_deadline WHAT     true (and says so in $AB_DIR/skipped.txt) when DEADLINE has passed, or
#                             when LIMIT would be passed by a run as long as the longest so far
#   ab_ran SECONDS            records a finished run's duration (for LIMIT)
ab_begin() {
  ab_work "$@"
  "$(dirname "${BASH_SOURCE[0]}")/ab_unpack.sh" "$AB_DIR" || exit 2
  ab_pack || exit 2
}
ab_work() {  # ab_begin without the A/B binaries (scripts/lab/ncu_device.sh): WORK, AB_DIR, the clock
  AB_OUT=$1 AB_NAME=$2 AB_TGZ=$3
  mkdir -p "$AB_OUT" || exit 2
  WORK=$(mktemp -d "${TMPDIR:-/tmp}/ab_$AB_NAME.XXXXXX") || exit 2
  trap 'rm -rf "$WORK"' EXIT
  AB_DIR=$WORK/$AB_NAME
  mkdir -p "$AB_DIR" || exit 2
  AB_START=$(date +%s)
}
ab_pack() {  # rename: never a half-written tarball in OUTDIR
  tar -C "$WORK" -czf "$AB_OUT/.$AB_TGZ.part" "$AB_NAME" && mv -f "$AB_OUT/.$AB_TGZ.part" "$AB_OUT/$AB_TGZ"
}
AB_LONGEST=0
ab_ran() { [ "$1" -gt "$AB_LONGEST" ] && AB_LONGEST=$1; return 0; }
ab_past_deadline() {
  local el=$(( $(date +%s) - AB_START ))
  if [ -n "${DEADLINE:-}" ] && [ "$el" -ge "$DEADLINE" ]; then
    echo "$1 SKIPPED: past DEADLINE=$DEADLINE s" | tee -a "$AB_DIR/skipped.txt"
    return 0
  fi
  if [ -n "${LIMIT:-}" ] && [ $(( el + AB_LONGEST + AB_LONGEST / 10 )) -gt "$LIMIT" ]; then
    echo "$1 SKIPPED: at ${el} s a run as long as the longest so far (${AB_LONGEST} s, +10%) would end past LIMIT=$LIMIT s" |
      tee -a "$AB_DIR/skipped.txt"
    return 0
  fi
  return 1
}
