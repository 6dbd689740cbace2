#!/usr/bin/env bash
# CTest helper: run a command, require its exit code (and optionally a regex in stderr+stdout).
# usage: expect_exit.sh CODE [REGEX|-] -- command args...
set -u
want=$1; shift
regex=$1; shift
[ "$1" = "--" ] && shift
out=$("$@" 2>&1)
rc=$?
echo "$out" | tail -n 20
if [ "$rc" != "$want" ]; then
  echo "expect_exit: exit code $rc, wanted $want: $*" >&2
  exit 1
fi
if [ "$regex" != "-" ] && ! echo "$out" | grep -Eq -- "$regex"; then
  echo "expect_exit: output does not match /$regex/" >&2
  exit 1
fi
exit 0
