#!/usr/bin/env python3
"""Test of scripts/lab/ncu_summary.py on synthetic Nsight Compute details pages (CTest: ncu_summary_script).

Two launches (a mangled and a demangled template name; durations in us and ms; shared memory in
Kbyte and byte; a metric repeated in a later section) must give the known values in the table and
the JSON; a launch without some metrics must read them as missing; a file without a launch, an
unreadable file and an unknown unit must exit 2.
"""
import json
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from script_checks import check, finish, run_script  # scripts/script_checks.py, one folder up

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "ncu_summary.py")

ZERO = "_ZN6punica7kernels47_GLOBAL__N__7ebf7ad9_14_lora_shrink_cu_f5bdb4e518shrink_zero_kernelEPfl"
PIPE = ("void punica::kernels::expand_stream::expand_pipe_kernel<__nv_bfloat16, float, 64, 128, 16, 2, 4, 2, 4>"
        "(punica::kernels::expand_stream::Params, int)")


def section(name, grid, block, dur, dur_unit, dram, smem, smem_unit, regs=112, extra=""):
    return f"""[499] punica-bench@127.0.0.1
  {name} ({grid}, 1, 1)x({block}, 1, 1), Context 1, Stream 13, Device 0, CC 9.0
    Section: GPU Speed Of Light Throughput
    ----------------------- ----------- ------------
    Metric Name             Metric Unit Metric Value
    ----------------------- ----------- ------------
    DRAM Frequency                  Ghz         3.12
    Memory Throughput                 %        69.62
    DRAM Throughput                   %        {dram}
    Duration                  {dur_unit:>11}        {dur}
    ----------------------- ----------- ------------
    Section: Memory Workload Analysis
    Local Memory Spilling Requests                                0
    Section: Scheduler Statistics
    Issued Warp Per Scheduler                        0.30
    Eligible Warps Per Scheduler        warp         0.43
    Section: Launch Statistics
    Block Size                                                   {block}
    Registers Per Thread             register/thread             {regs}
    Dynamic Shared Memory Per Block  {smem_unit:>15}            {smem}
    Waves Per SM                                                   1
    Section: Occupancy
    Theoretical Occupancy                     %           25
    Achieved Occupancy                        %        23.96
{extra}"""


def main():
    with tempfile.TemporaryDirectory() as d:
        rep = os.path.join(d, "shrink.txt")
        with open(rep, "w") as f:
            f.write("==PROF== Connected to process 499\n# punica-bench output line\n")
            f.write(section(ZERO, 128, 256, "2.14", "us", "0.09", "0", "byte/block", regs=30))
            # a later section repeats Duration: the first value counts
            f.write(section(PIPE, 2192, 256, "0.07846", "ms", "64.90", "50.18", "Kbyte/block", regs=63,
                            extra="    Section: Extra\n    Duration                         us        1.00\n"))
        out = os.path.join(d, "s.json")
        rc, text = run_script(SCRIPT, rep, "--json", out)
        check(rc == 0, f"two launches: exit 0 (got {rc}: {text})")
        check("shrink_zero_kernel" in text and "expand_pipe_kernel" in text, "short kernel names in the table")
        check("2192x256" in text, "grid x block in the table")
        try:
            with open(out) as f:
                j = json.load(f)
        except (OSError, ValueError) as e:
            j = {"launches": []}
            check(False, f"--json wrote readable JSON ({e})")
        L = j["launches"]
        check(j.get("schema") == "punica-bench.ncu-summary/1", "schema named")
        check(len(L) == 2, f"two launches in the JSON (got {len(L)})")
        if len(L) == 2:
            z, p = L
            check(z["kernel"] == "shrink_zero_kernel" and z["name"] == ZERO, f"mangled name shortened ({z['kernel']})")
            check(p["kernel"] == "expand_pipe_kernel", f"template name shortened ({p['kernel']})")
            check(abs(z["duration_us"] - 2.14) < 1e-9, f"duration in us ({z['duration_us']})")
            check(abs(p["duration_us"] - 78.46) < 1e-6, f"duration in ms -> us, first value kept ({p['duration_us']})")
            check(abs(p["dram_pct"] - 64.9) < 1e-9 and abs(z["dram_pct"] - 0.09) < 1e-9, "DRAM throughput")
            check(abs(p["dynamic_smem_kb"] - 50.18) < 1e-9 and z["dynamic_smem_kb"] == 0, "shared memory in KB")
            check(p["registers"] == 63 and z["registers"] == 30, "registers")
            check(abs(p["achieved_occupancy_pct"] - 23.96) < 1e-9 and p["theoretical_occupancy_pct"] == 25, "occupancy")
            check(abs(p["eligible_warps"] - 0.43) < 1e-9 and abs(p["issued_warps"] - 0.30) < 1e-9, "scheduler")
            check(p["grid"] == [2192, 1, 1] and p["block"] == [256, 1, 1], "grid and block")
            check(p["spill_requests"] == 0 and p["waves"] == 1, "spills and waves")

        # a launch whose report lacks most sections: missing values, not zeros
        part = os.path.join(d, "part.txt")
        with open(part, "w") as f:
            f.write(f"  {ZERO} (1, 1, 1)x(32, 1, 1), Context 1, Stream 7, Device 0, CC 9.0\n"
                    "    Duration                         us         1.50\n")
        rc, text = run_script(SCRIPT, part, "--json", out)
        check(rc == 0, f"partial report: exit 0 (got {rc}: {text})")
        with open(out) as f:
            q = json.load(f)["launches"][0]
        check(q["dram_pct"] is None and q["registers"] is None, "metrics the report lacks are null")
        check(" - " in text, "metrics the report lacks read '-' in the table")

        empty = os.path.join(d, "empty.txt")
        with open(empty, "w") as f:
            f.write("==PROF== Connected\n==ERROR== the profiled process failed\n")
        rc, text = run_script(SCRIPT, empty)
        check(rc == 2 and "no kernel launch" in text, f"a report without launches: exit 2 (got {rc}: {text})")
        rc, text = run_script(SCRIPT, os.path.join(d, "missing.txt"))
        check(rc == 2 and "cannot read" in text, f"a missing file: exit 2 (got {rc}: {text})")
        bad = os.path.join(d, "bad.txt")
        with open(bad, "w") as f:
            f.write(f"  {ZERO} (1, 1, 1)x(32, 1, 1), Context 1, Stream 7, Device 0, CC 9.0\n"
                    "    Duration                      fortnight         1.50\n")
        rc, text = run_script(SCRIPT, bad)
        check(rc == 2 and "unknown unit" in text, f"an unknown duration unit: exit 2 (got {rc}: {text})")
        rc, text = run_script(SCRIPT)
        check(rc != 0 and "usage" in text, f"no file: usage and non-zero exit (got {rc})")
    return finish("ncu_summary_test")


if __name__ == "__main__":
    sys.exit(main())
