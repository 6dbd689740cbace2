#!/usr/bin/env python3
"""Test of scripts/lab/trace_chain.py on synthetic kernel timelines (CTest: trace_chain_script).

Known start / end times of zero -> shrink -> expand chains, ordinary and in a graph, one with the
expand starting before the shrink ends (programmatic dependent launch) and one with a gap, must give
the known durations, overlaps and spans; kernels on another stream must not pair; a CSV without the
probe's columns, a row with a bad number and a trace with no chain must exit 2.
"""
import json
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from script_checks import check, finish, run_script  # scripts/script_checks.py, one folder up

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "trace_chain.py")
HEADER = "name,start_ns,end_ns,stream,grid_x,grid_y,grid_z,block_x,correlation,graph_id,graph_node_id\n"
ZERO = "_ZN6punica7kernels12_GLOBAL__N_118shrink_zero_kernelEv"
SHRINK = "_ZN6punica7kernels12_GLOBAL__N_119shrink_fused_kernelILi64EEEvNS1_12ShrinkParamsE"
EXPAND = "_ZN13expand_stream18expand_pipe_kernelI13__nv_bfloat16EEvNS_12ExpandParamsE"


def row(name, start, end, stream=7, grid=(33, 9, 1), graph=0):
    return f"{name},{start},{end},{stream},{grid[0]},{grid[1]},{grid[2]},256,1,{graph},0\n"


def write(d, name, text):
    path = os.path.join(d, name)
    with open(path, "w") as f:
        f.write(text)
    return path


def run(*args):
    return run_script(SCRIPT, *args)


def main():
    with tempfile.TemporaryDirectory() as d:
        t = HEADER
        # ordinary launches, two chains: zero 2 us, shrink 18 us, expand starts 3 us before the shrink
        # ends (overlap +3 us), runs 28 us; span = zero start -> expand end
        for base in (0, 100_000):
            t += row(ZERO, base, base + 2_000)
            t += row(SHRINK, base + 2_500, base + 20_500)
            t += row(EXPAND, base + 17_500, base + 45_500, grid=(12, 34, 1))
        # an expand on another stream right after: must not pair with anything
        t += row(EXPAND, 50_000, 60_000, stream=9, grid=(12, 34, 1))
        # in a graph: no zero kernel, 1 us gap between shrink and expand
        t += row(SHRINK, 200_000, 216_000, graph=5)
        t += row(EXPAND, 217_000, 245_000, grid=(12, 34, 1), graph=5)
        trace = write(d, "t.csv", t)
        out_json = os.path.join(d, "t.json")
        rc, out = run(trace, "--json", out_json)
        check(rc == 0, f"a good trace exits 0 (got {rc}: {out})")
        rows = json.load(open(out_json)) if rc == 0 else []
        check(len(rows) == 2, f"two groups (ordinary, graph), got {len(rows)}")
        by = {r["launch"]: r for r in rows}
        o, g = by.get("ordinary", {}), by.get("graph", {})
        check(o.get("chains") == 2, f"two ordinary chains, got {o.get('chains')}")
        check(o.get("first") == "shrink_fused_kernel" and o.get("last") == "expand_pipe_kernel",
              f"short names from the mangled ones, got {o.get('first')} / {o.get('last')}")
        check(o.get("first_grid") == "33x9x1" and o.get("last_grid") == "12x34x1", "grids as given")
        check(abs((o.get("lead_us") or 0) - 2.0) < 1e-9, f"lead 2 us, got {o.get('lead_us')}")
        check(abs((o.get("first_us") or 0) - 18.0) < 1e-9, f"first 18 us, got {o.get('first_us')}")
        check(abs((o.get("last_us") or 0) - 28.0) < 1e-9, f"last 28 us, got {o.get('last_us')}")
        check(abs((o.get("overlap_us") or 0) - 3.0) < 1e-9, f"overlap +3 us, got {o.get('overlap_us')}")
        check(abs((o.get("span_us") or 0) - 45.5) < 1e-9, f"span 45.5 us, got {o.get('span_us')}")
        check(g.get("chains") == 1 and g.get("lead_us") is None, f"one graph chain without a lead, got {g}")
        check(abs((g.get("overlap_us") or 0) + 1.0) < 1e-9, f"graph chain: a 1 us gap (-1), got {g.get('overlap_us')}")
        check(abs((g.get("span_us") or 0) - 45.0) < 1e-9, f"graph chain span 45 us, got {g.get('span_us')}")
        check("expand_pipe_kernel" in out and "ordinary" in out, "the table names the kernels and the launch kind")

        rc, out = run(write(d, "nohdr.csv", "a,b,c\n1,2,3\n"))
        check(rc == 2 and "no column" in out and "nohdr.csv" in out, f"a CSV without the columns exits 2 naming it: {rc} {out}")
        rc, out = run(write(d, "bad.csv", HEADER + row(SHRINK, 0, 10).replace(",10,", ",x,", 1)))
        check(rc == 2 and "bad.csv:2" in out, f"a bad number exits 2 naming file:line: {rc} {out}")
        rc, out = run(write(d, "rev.csv", HEADER + row(SHRINK, 10, 5)))
        check(rc == 2 and "before start_ns" in out, f"end before start exits 2: {rc} {out}")
        rc, out = run(write(d, "none.csv", HEADER + row(EXPAND, 0, 10) + row(SHRINK, 20, 30)))
        check(rc == 2 and "no kernel matching" in out, f"no chain exits 2: {rc} {out}")
        rc, out = run(trace, "--first", "(")
        check(rc == 2 and "bad regular expression" in out, f"a bad regex exits 2: {rc} {out}")
    return finish("trace_chain_test")


if __name__ == "__main__":
    sys.exit(main())
