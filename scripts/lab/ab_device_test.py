#!/usr/bin/env python3
"""Test of the GPU machine's A/B drivers, scripts/lab/ab_bench_device.sh and scripts/lab/ab_device.sh, with
fake binaries on the CPU (CTest: ab_device_scripts).

The device tool returns at most 8 files from a call's $OUT and cuts a call at its limit: OUTDIR must
hold one tarball only, rewritten after every run, so that a call killed mid-run still returns every
finished run (NOTES v28 part 5 lost a call to 22 loose files). DEADLINE must skip the runs that
would start past it, and LIMIT the runs that would end past it, say so, and exit non-zero.
"""
import os
import signal
import stat
import subprocess
import sys
import tarfile
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from script_checks import check, finish  # scripts/script_checks.py, one folder up

HERE = os.path.dirname(os.path.abspath(__file__))
BENCH = os.path.join(HERE, "ab_bench_device.sh")
GTEST = os.path.join(HERE, "ab_device.sh")


# A fake punica-bench: writes a result JSON to the file after -o; the run of variant b in round 2
# hangs (the call is cut while it runs).
FAKE_BENCH = r"""#!/bin/sh
out=""
while [ $# -gt 0 ]; do
  if [ "$1" = "-o" ]; then out=$2; shift; fi
  shift
done
case "$out" in *b_2.json) sleep 300 ;; esac
echo '{"schema": "punica-bench.result/1", "cases": []}' > "$out"
echo "fake bench wrote $out"
"""

# A fake gtest binary: prints its filter; the perf run of variant b in round 2 hangs.
FAKE_GTEST = r"""#!/bin/sh
echo "fake gtest $0 $*"
case "$0:$*" in *_b:*also_run_disabled*) [ -f "$AB_TEST_ROUND2" ] && sleep 300; touch "$AB_TEST_ROUND2" ;; esac
exit 0
"""


def make_carry(root, target, script):
    binst = os.path.join(root, "stage", "bin")
    os.makedirs(binst)
    for n in ("a", "b"):
        p = os.path.join(binst, f"{target}_{n}")
        with open(p, "w") as f:
            f.write(script)
        os.chmod(p, os.stat(p).st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    with open(os.path.join(root, "stage", "refs.txt"), "w") as f:
        f.write("a 0000000\nb 1111111\n")
    os.makedirs(os.path.join(root, ".carry"))
    with tarfile.open(os.path.join(root, ".carry", "ab-bin.txz"), "w:xz") as t:
        t.add(binst, arcname="bin")
        t.add(os.path.join(root, "stage", "refs.txt"), arcname="refs.txt")


def members(tgz):
    try:
        with tarfile.open(tgz) as t:
            return {os.path.basename(m.name) for m in t.getmembers() if m.isfile()}
    except (OSError, tarfile.TarError):
        return set()


def run_until(cmd, cwd, env, tgz, want, limit=30):
    """Start cmd in its own process group; once tgz holds every name in want, kill the group (the
    device tool cutting the call). Returns the set of names in tgz at the end."""
    p = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         start_new_session=True)
    t0 = time.time()
    while time.time() - t0 < limit:
        if want <= members(tgz):
            break
        if p.poll() is not None:
            break
        time.sleep(0.2)
    if p.poll() is None:
        os.killpg(p.pid, signal.SIGKILL)
    p.wait()
    return members(tgz)


def run_capped(cmd, cwd, env, limit):
    """Run cmd in its own session; (exit status, stdout), or (None, a note) when it runs past limit s."""
    try:
        p = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=limit,
                           start_new_session=True)
        return p.returncode, p.stdout
    except subprocess.TimeoutExpired:
        return None, f"(still running after {limit} s)"


with tempfile.TemporaryDirectory() as root:
    env = dict(os.environ, TMPDIR=os.path.join(root, "tmp"))
    os.makedirs(env["TMPDIR"])

    # 1. ab_bench_device.sh cut while variant b's second run hangs: a_1, b_1, a_2 come back.
    w = os.path.join(root, "bench")
    make_carry(w, "punica-bench", FAKE_BENCH)
    out = os.path.join(w, "out")
    got = run_until(["bash", BENCH, out, "x", "2", "a", "b"], w, env, os.path.join(out, "bench_ab.tgz"),
                    {"a_1.json", "b_1.json", "a_2.json"})
    check({"a_1.json", "a_1.log", "b_1.json", "a_2.json", "refs.txt", "gpu.txt"} <= got,
          f"bench: a cut call returns the finished runs (got {sorted(got)})")
    check("b_2.json" not in got, "bench: the hanging run has no result")
    check(sorted(os.listdir(out)) == ["bench_ab.tgz"], f"bench: OUTDIR holds the tarball only ({os.listdir(out)})")

    # 2. DEADLINE=0: every run skipped, reported, non-zero exit, the tarball still written.
    out2 = os.path.join(w, "out2")
    rc, text = run_capped(["bash", BENCH, out2, "x", "2", "a", "b"], w, dict(env, DEADLINE="0"), 30)
    check(rc is not None and rc != 0, "bench: DEADLINE=0 exits non-zero")
    check(text.count("SKIPPED") == 4, f"bench: DEADLINE=0 skips 4 runs ({text!r})")
    got2 = members(os.path.join(out2, "bench_ab.tgz"))
    check("skipped.txt" in got2 and not any(n.endswith(".json") for n in got2),
          f"bench: the skipped runs are listed in the tarball ({sorted(got2)})")

    # 3. A whole run: exit 0, both rounds of both variants, no work folder left behind.
    w3 = os.path.join(root, "bench3")
    make_carry(w3, "punica-bench", FAKE_BENCH.replace("sleep 300", "true"))
    out3 = os.path.join(w3, "out")
    env3 = dict(env, TMPDIR=os.path.join(root, "tmp3"))  # a killed call leaves its work folder; this one may not
    os.makedirs(env3["TMPDIR"])
    p = subprocess.run(["bash", BENCH, out3, "x", "2", "a", "b"], cwd=w3, env=env3, capture_output=True, text=True,
                       timeout=60)
    check(p.returncode == 0, f"bench: a whole run exits 0 ({p.stdout + p.stderr!r})")
    check({"a_1.json", "b_1.json", "a_2.json", "b_2.json"} <= members(os.path.join(out3, "bench_ab.tgz")),
          "bench: a whole run returns every result")
    check(os.listdir(env3["TMPDIR"]) == [], f"bench: the work folder is removed ({os.listdir(env3['TMPDIR'])})")

    # 4. ab_device.sh cut in variant b's second perf run: the correctness logs and round 1 come back.
    w4 = os.path.join(root, "gtest")
    make_carry(w4, "foo_test", FAKE_GTEST)
    out4 = os.path.join(w4, "out")
    env4 = dict(env, AB_TEST_ROUND2=os.path.join(root, "round2"))
    got4 = run_until(["bash", GTEST, out4, "foo_test", "Perf.*", "2", "a", "b"], w4, env4,
                     os.path.join(out4, "ab.tgz"), {"correct_a.txt", "correct_b.txt", "perf_a_1.txt", "perf_b_1.txt",
                                                     "perf_a_2.txt"})
    check({"correct_a.txt", "correct_b.txt", "perf_a_1.txt", "perf_b_1.txt", "perf_a_2.txt"} <= got4,
          f"gtest: a cut call returns the finished runs (got {sorted(got4)})")
    check(sorted(os.listdir(out4)) == ["ab.tgz"], f"gtest: OUTDIR holds the tarball only ({os.listdir(out4)})")

    # 5. LIMIT: runs of 3 s under LIMIT=8 (NOTES v37: a run started too late was cut with the call):
    #    a_1 and b_1 run (b_1 starts at 3-4 s), a_2 and b_2 would end past 8 s and are skipped, said so,
    #    non-zero exit.
    w5 = os.path.join(root, "bench5")
    make_carry(w5, "punica-bench", FAKE_BENCH.replace("case", "sleep 3\ncase", 1).replace("sleep 300", "true"))
    out5 = os.path.join(w5, "out")
    rc, text = run_capped(["bash", BENCH, out5, "x", "2", "a", "b"], w5, dict(env, LIMIT="8"), 60)
    check(rc is not None and rc != 0, f"bench: LIMIT skips exit non-zero (rc {rc})")
    check(text.count("SKIPPED") == 2 and "LIMIT=8" in text, f"bench: LIMIT=8 skips the 2 runs of round 2 ({text!r})")
    got5 = members(os.path.join(out5, "bench_ab.tgz"))
    check({"a_1.json", "b_1.json", "skipped.txt"} <= got5 and "a_2.json" not in got5,
          f"bench: LIMIT keeps round 1 ({sorted(got5)})")

    # 6. An empty FILTER is refused with a usage line that says how to match every case.
    p = subprocess.run(["bash", BENCH, out5, "", "2", "a"], cwd=w5, env=env, capture_output=True, text=True, timeout=30)
    check(p.returncode != 0 and "'/' matches every case" in p.stderr, f"bench: empty FILTER refused ({p.stderr!r})")

sys.exit(finish("ab_device_test"))
