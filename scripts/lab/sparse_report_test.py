#!/usr/bin/env python3
"""Test of scripts/lab/sparse_report.py on synthetic result files (CTest: sparse_report_script).

Known times of hinted cases, their plain twins and a bench twin must give the known ratios; a failing
case must not count; a file without hinted cases and a file that is not a result must exit 2.
"""
import json
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from script_checks import check, finish, run_script  # scripts/script_checks.py, one folder up

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "sparse_report.py")
TAIL = "phase=decode/num_requests=64/tokens_per_request=1/max_loras=32/num_adapters=1"


def case(cid, op, cold, b2b, adapters=1, max_loras=32, status="pass"):
    return {"id": cid, "op": op, "status": status,
            "params": {"num_tokens": 64, "hidden": 4096, "slices": [4096], "ranks": [64],
                       "max_loras": max_loras, "num_adapters": adapters},
            "timing": {"time_us": {"median": cold}, "batch_time_us": b2b}}


def write(d, name, cases):
    path = os.path.join(d, name)
    with open(path, "w") as f:
        json.dump({"schema": "punica-bench.result/1", "cases": cases}, f)
    return path


def run(*args):
    return run_script(SCRIPT, *args)


def main():
    with tempfile.TemporaryDirectory() as d:
        sparse = write(d, "sparse.json", [
            case(f"s/lora_shrink/{TAIL}/ranks=64", "lora_shrink", 20.0, 10.0),
            case(f"s_hinted/lora_shrink/{TAIL}/active_loras_hint=1/ranks=64", "lora_shrink", 10.0, 4.0),
            case(f"s/lora_expand/{TAIL}/ranks=64", "lora_expand", 10.0, 8.0),
            case(f"s_hinted/lora_expand/{TAIL}/active_loras_hint=1/ranks=64", "lora_expand", 12.0, 10.0),
            # a failing hinted case does not count
            case(f"t_hinted/lora_shrink/{TAIL}/active_loras_hint=1/ranks=64", "lora_shrink", 1.0, 1.0, status="fail"),
            case(f"t/lora_shrink/{TAIL}/ranks=64", "lora_shrink", 10.0, 10.0),
        ])
        bench = write(d, "bench.json", [
            case("b/lora_shrink/x", "lora_shrink", 8.0, 5.0, adapters=1, max_loras=1),
        ])
        rc, out = run(sparse, bench)
        check(rc == 0, f"exit 0 on good files, got {rc}: {out}")
        check("hinted / plain (2 pairs)" in out, "two pairs (the failing hinted case left out)")
        check("lora_shrink" in out and "0.400 [0.400..0.400]" in out and "0.500 [0.500..0.500]" in out,
              "shrink: back to back 4 / 10, cold 10 / 20")
        check("1.250 [1.250..1.250]" in out and "1.200 [1.200..1.200]" in out, "expand: 10 / 8 and 12 / 10")
        check("hinted slower than plain back to back (> 1.02): 1" in out, "one slower pair listed")
        check("full batch of the same adapters (1 pairs)" in out and "0.800 [0.800..0.800]" in out,
              "bench twin: back to back 4 / 5")
        check("1.250 [1.250..1.250]" in out.split("full batch")[0], "the twin section holds only the twin")
        none = write(d, "none.json", [case(f"s/lora_shrink/{TAIL}", "lora_shrink", 1.0, 1.0)])
        rc, out = run(none)
        check(rc == 2 and "no passing *_hinted case" in out, f"no hinted case: exit 2, got {rc}: {out}")
        bad = os.path.join(d, "bad.json")
        with open(bad, "w") as f:
            f.write("not json")
        rc, out = run(bad)
        check(rc == 2 and "not a punica-bench result" in out, f"bad file: exit 2, got {rc}: {out}")
        rc, out = run()
        check(rc == 2, f"no arguments: exit 2, got {rc}")
    return finish("sparse_report_test")


if __name__ == "__main__":
    sys.exit(main())
