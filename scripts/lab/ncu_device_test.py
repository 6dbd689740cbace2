#!/usr/bin/env python3
"""Test of scripts/lab/ncu_device.sh (the GPU machine's ncu profile of chosen cases) with fake ncu,
cuobjdump and punica-bench on the CPU (CTest: ncu_device_script).

OUTDIR must hold one tarball with each case's report, the SASS of each profiled kernel once (two cases
sharing a kernel dump it once), and the summary table of every report that has a launch; a case whose
profile fails must not lose the others (exit 1); LIMIT must skip a case that would end past it and
say so; bad arguments and a missing binary must exit 2.
"""
import os
import stat
import subprocess
import sys
import tarfile
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from script_checks import check, finish  # scripts/script_checks.py, one folder up

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "ncu_device.sh")
ZERO = "_ZN6punica7kernels18shrink_zero_kernelEPfl"
FUSED = "_ZN6punica7kernels19shrink_fused_kernelEv"
PIPE = "_ZN6punica7kernels18expand_pipe_kernelEv"

# A fake ncu: the case filter follows -f; 'fail' cases die before any kernel, 'slow' ones sleep.
FAKE_NCU = r"""#!/bin/sh
[ "$1" = "--version" ] && { echo "fake ncu 0.0"; exit 0; }
f=""
while [ $# -gt 0 ]; do
  if [ "$1" = "-f" ]; then f=$2; shift; fi
  shift
done
case "$f" in *fail*) echo "==ERROR== the application returned an error"; exit 1 ;; esac
case "$f" in *slow*) sleep 2 ;; esac
k2=FUSED
case "$f" in *expand*) k2=PIPE ;; esac
for k in ZERO $k2; do
  echo "  $k (264, 1, 1)x(256, 1, 1), Context 1, Stream 13, Device 0, CC 9.0"
  echo "    Duration                         us        41.73"
  echo "    DRAM Throughput                   %        69.62"
done
exit 0
""".replace("ZERO", ZERO).replace("$k2", "$k2").replace("k2=FUSED", f"k2={FUSED}").replace("k2=PIPE", f"k2={PIPE}")

FAKE_CUOBJDUMP = r"""#!/bin/sh
echo "fake SASS of $3"
"""
FAKE_PB = r"""#!/bin/sh
echo "punica-bench 0.0.0 (fake)"
"""


def make(d):
    b = os.path.join(d, "bin")
    os.makedirs(b)
    for name, text in (("ncu", FAKE_NCU), ("cuobjdump", FAKE_CUOBJDUMP), ("punica-bench", FAKE_PB)):
        p = os.path.join(b, name)
        with open(p, "w") as f:
            f.write(text)
        os.chmod(p, os.stat(p).st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    os.makedirs(os.path.join(d, "scenarios"))
    with open(os.path.join(d, "scenarios", "bench_lora_ops.json"), "w") as f:
        f.write("{}\n")
    env = dict(os.environ, NCU=os.path.join(b, "ncu"), CUOBJDUMP=os.path.join(b, "cuobjdump"),
               PB=os.path.join(b, "punica-bench"))
    env.pop("LIMIT", None)
    return env


def run(d, env, *args, limit=60):
    p = subprocess.run(["bash", SCRIPT, *args], cwd=d, env=env, capture_output=True, text=True, timeout=limit)
    return p.returncode, p.stdout + p.stderr


def tar_text(tgz):
    """{member path below ncu_run/: text} of the tarball (empty when missing or unreadable)."""
    out = {}
    try:
        with tarfile.open(tgz) as t:
            for m in t.getmembers():
                if m.isfile():
                    out[m.name.split("ncu_run/", 1)[-1]] = t.extractfile(m).read().decode(errors="replace")
    except (OSError, tarfile.TarError):
        pass
    return out


def main():
    with tempfile.TemporaryDirectory() as d:
        env = make(d)
        out = os.path.join(d, "out")
        rc, text = run(d, env, out, "sh1=^single/lora_shrink/", "bad=fail_here", "sh2=^qkv/lora_shrink/",
                       "ex=^single/lora_expand/")
        check(rc == 1, f"a failed case: exit 1 (got {rc}: {text})")
        check(sorted(os.listdir(out)) == ["ncu.tgz"], f"OUTDIR holds only ncu.tgz ({os.listdir(out)})")
        files = tar_text(os.path.join(out, "ncu.tgz"))
        for n in ("sh1", "bad", "sh2", "ex"):
            check(f"ncu/{n}.txt" in files, f"report of case {n} in the tarball")
        index = files.get("sass/index.txt", "")
        lines = [l for l in index.splitlines() if l.strip()]
        check(len(lines) == 3, f"SASS of each of the 3 kernels once, though two cases share two of them ({lines})")
        for k in (ZERO, FUSED, PIPE):
            check(any(l.endswith(" " + k) for l in lines), f"{k} in sass/index.txt")
            h = next((l.split()[0] for l in lines if l.endswith(" " + k)), None)
            check(h is not None and f"fake SASS of {k}" in files.get(f"sass/{h}.sass", ""), f"SASS file of {k}")
        summary = files.get("summary.txt", "")
        check(summary.count("shrink_zero_kernel") == 3 and "expand_pipe_kernel" in summary,
              f"summary has every launch of the cases that ran ({summary})")
        check("bad.txt" not in summary, "the failed case's report is left out of the summary")
        check("summary.json" in files and "gpu.txt" in files, "summary.json and gpu.txt in the tarball")

        # LIMIT: the second slow case would end past it
        out2 = os.path.join(d, "out2")
        rc, text = run(d, dict(env, LIMIT="3"), out2, "s1=slow_one", "s2=slow_two")
        files = tar_text(os.path.join(out2, "ncu.tgz"))
        check(rc == 1, f"a case skipped by LIMIT: exit 1 (got {rc}: {text})")
        check("ncu/s1.txt" in files and "ncu/s2.txt" not in files, "LIMIT ran the first case and skipped the second")
        check("s2 SKIPPED" in files.get("skipped.txt", "") and "LIMIT=3" in text, "the skip is reported")

        # usage errors and a missing binary: exit 2
        for args in ([out], [out, "noequals"], [out, "a/b=^x"], [out, "name="]):
            rc, text = run(d, env, *args)
            check(rc == 2, f"usage error {args[1:]}: exit 2 (got {rc}: {text})")
        rc, text = run(d, dict(env, PB=os.path.join(d, "bin", "none")), out, "a=^x")
        check(rc == 2 and "no punica-bench" in text, f"missing binary: exit 2 (got {rc}: {text})")
        rc, text = run(d, dict(env, SCENARIO="scenarios/none.json"), out, "a=^x")
        check(rc == 2 and "no scenario" in text, f"missing scenario: exit 2 (got {rc}: {text})")
    return finish("ncu_device_test")


if __name__ == "__main__":
    sys.exit(main())
