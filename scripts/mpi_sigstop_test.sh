#!/usr/bin/env bash
# CTest (issue 43): a rank stopped with SIGSTOP must not hang a run under --timeout. Starts
#   MPIRUN... -np 2 PUNICA_BENCH check --backend cpu --timeout T SCENARIO
# stops rank 1 (SIGSTOP) once rank 0 has started a few cases, and requires mpirun to exit with
# code 5 within T + 10 s of the stop, with a message naming the case and rank 1 as the rank that
# stopped answering. Rank 1 is resumed or killed on the way out, whatever happens.
# usage: mpi_sigstop_test.sh T PUNICA_BENCH SCENARIO MPIRUN [MPIRUN_ARGS...]
set -u
T=$1 PB=$2 SCEN=$3
shift 3
out=$(mktemp)
"$@" -np 2 "$PB" check --backend cpu --timeout "$T" "$SCEN" >"$out" 2>&1 &
mpid=$!
victim=""
cleanup() {
  if [ -n "$victim" ]; then kill -CONT "$victim" 2>/dev/null; kill -KILL "$victim" 2>/dev/null; fi
  kill -0 "$mpid" 2>/dev/null && kill -TERM "$mpid" 2>/dev/null
  rm -f "$out"
}
trap cleanup EXIT
say() { echo "mpi_sigstop_test: $*" >&2; }

# rank 1: the descendant of this mpirun whose environment says OMPI_COMM_WORLD_RANK=1 (or PMIX_RANK=1)
children() {  # the pids whose parent is $1 (from /proc, no procps needed)
  local parent=$1 st line rest
  for st in /proc/[0-9]*/stat; do
    { read -r line <"$st"; } 2>/dev/null || continue
    rest=${line##*) }  # after the command name, which may hold spaces: "STATE PPID ..."
    set -- $rest
    [ "${2:-}" = "$parent" ] && { st=${st#/proc/}; echo "${st%/stat}"; }
  done
}
descendants() {
  local todo="$1" all="" kids p
  while [ -n "$todo" ]; do
    kids=""
    for p in $todo; do
      all="$all $p"
      kids="$kids $(children "$p")"
    done
    todo=$(echo $kids)
  done
  echo "$all"
}
for _ in $(seq 1 300); do  # up to 30 s for the start and three cases on a loaded machine
  if ! kill -0 "$mpid" 2>/dev/null; then say "mpirun ended before rank 1 could be stopped"; cat "$out"; exit 1; fi
  if [ -z "$victim" ]; then
    for p in $(descendants "$mpid"); do
      if tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -Eqx '(OMPI_COMM_WORLD_RANK|PMIX_RANK)=1'; then
        victim=$p
        break
      fi
    done
  fi
  [ -n "$victim" ] && grep -q '^\[ *3/' "$out" && break
  sleep 0.1
done
[ -n "$victim" ] || { say "rank 1 not found"; cat "$out"; exit 1; }
kill -STOP "$victim"
t0=$(date +%s%3N)
say "stopped rank 1 (pid $victim) after: $(grep '^\[' "$out" | tail -n 1)"
limit_ms=$(((T + 10) * 1000))
while kill -0 "$mpid" 2>/dev/null; do
  el_ms=$(($(date +%s%3N) - t0))
  if [ "$el_ms" -gt $((limit_ms + 5000)) ]; then
    say "mpirun still running ${el_ms} ms after the stop (limit ${limit_ms} ms): hung"
    tail -n 20 "$out"
    exit 1
  fi
  sleep 0.2
done
wait "$mpid"
rc=$?
el_ms=$(($(date +%s%3N) - t0))
tail -n 8 "$out"
say "mpirun exit code $rc, ${el_ms} ms after the stop (limit ${limit_ms} ms)"
[ "$rc" = 5 ] || { say "wanted exit code 5"; exit 1; }
[ "$el_ms" -le "$limit_ms" ] || { say "took longer than --timeout + 10 s"; exit 1; }
grep -Eq "timeout: case '[^']+' ran past --timeout $T s on rank 0( [(][^)]*[)])?; rank 1 stopped answering" "$out" ||
  { say "no message naming the case and rank 1 as the rank that stopped answering"; exit 1; }
exit 0
