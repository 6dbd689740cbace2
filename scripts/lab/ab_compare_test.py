#!/usr/bin/env python3
"""Test of scripts/lab/ab_compare.py on synthetic A/B folders (CTest: ab_compare_script).

Known per-round times must give the known median ratios; a failing case, a missing case, a variant
without files and a file that is not a result must each give their exit status.
"""
import json
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from script_checks import check, finish, run_script  # scripts/script_checks.py, one folder up

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "ab_compare.py")


def case(cid, op, tokens, cold, b2b, status="pass"):
    return {"id": cid, "op": op, "status": status, "params": {"num_tokens": tokens},
            "timing": {"time_us": {"median": cold}, "batch_time_us": b2b}}


def write(d, name, cases):
    with open(os.path.join(d, name), "w") as f:
        json.dump({"schema": "punica-bench.result/1", "cases": cases}, f)


def run(*args):
    return run_script(SCRIPT, *args)


with tempfile.TemporaryDirectory() as root:
    d = os.path.join(root, "bench_ab")
    os.makedirs(d)
    x, y = "s/lora_expand/hidden=4096/num_requests=64/max_loras=8", "s/lora_shrink/hidden=4096/num_requests=256/max_loras=1"
    # main: medians cold 10 / 20, b2b 4 / 8 (three rounds; the outlier round does not move a median)
    write(d, "main_1.json", [case(x, "lora_expand", 64, 10, 4), case(y, "lora_shrink", 256, 20, 8)])
    write(d, "main_2.json", [case(x, "lora_expand", 64, 10, 4.2), case(y, "lora_shrink", 256, 20, 8)])
    write(d, "main_3.json", [case(x, "lora_expand", 64, 99, 3.8), case(y, "lora_shrink", 256, 19, 8.1)])
    # new: x at half the time back to back, y 1.25x
    write(d, "new_1.json", [case(x, "lora_expand", 64, 8, 2), case(y, "lora_shrink", 256, 25, 10)])
    write(d, "new_2.json", [case(x, "lora_expand", 64, 8, 2), case(y, "lora_shrink", 256, 25, 10)])
    rc, out = run(root, "main", "new", "--json", os.path.join(root, "cmp.json"))  # the parent of bench_ab/
    check(rc == 0, f"clean comparison exits 0 (got {rc}): {out}")
    check("0.500 (cold 0.800)" in out, "x: back to back 2 / 4, cold 8 / 10: " + out)
    check("1.250 (cold 1.250)" in out, "y: 10 / 8 and 25 / 20: " + out)
    check("2 / 3 rounds" in out, "rounds of each variant counted: " + out)
    with open(os.path.join(root, "cmp.json")) as f:
        j = json.load(f)
    rows = {r["id"]: r for r in j["variants"]["new"]["cases"]}
    check(abs(rows[x]["b2b_ratio"] - 0.5) < 1e-9 and abs(rows[y]["cold_ratio"] - 1.25) < 1e-9, "JSON ratios")
    check(not [f for f in os.listdir(root) if f.startswith(".ab_compare.")], "no temporary file left behind")
    rc, out = run(root, "main", "new", "--top", "0", "--cases", "lora_shrink/")
    check(rc == 0 and "cases matching --cases (1)" in out, f"--cases: one match (got {rc}): {out}")
    check("1.250 1.250     8.00 ->    10.00 us  s/lora_shrink" in out, "--cases lists y's ratios and times: " + out)
    check("s/lora_expand" not in out, "--cases leaves x out (and --top 0 lists no ends): " + out)
    # --best: x beats main by 50% / 20% (new), y by none; a second variant faster cold only on y
    write(d, "cold_1.json", [case(x, "lora_expand", 64, 9, 4.4), case(y, "lora_shrink", 256, 15, 8.8)])
    rc, out = run(root, "main", "new", "cold", "--top", "0", "--best", "0.1", "--json", os.path.join(root, "best.json"))
    check(rc == 0 and "(2 of 2)" in out, f"--best 0.1: both cases listed (got {rc}): {out}")
    check("new          0.500 (0.800) new          0.800 (0.500)" in out, "--best: x's fastest is new both ways: " + out)
    check("cold         1.100 (0.750) cold         0.750 (1.100)" in out, "--best: y's fastest is cold both ways: " + out)
    with open(os.path.join(root, "best.json")) as f:
        best = {r["id"]: r for r in json.load(f)["best"]}
    check(best[y]["best_cold"]["variant"] == "cold" and abs(best[y]["best_cold"]["ratio"] - 0.75) < 1e-9,
          "--best JSON: y's fastest cold variant and ratio")
    rc, out = run(root, "main", "new", "--top", "0", "--best", "0.3")
    check(rc == 0 and "(1 of 2)" in out and "s/lora_shrink" not in out, f"--best 0.3: x only (got {rc}): {out}")
    rc, out = run(root, "main", "new", "--best", "1.5")
    check(rc == 2 and "--best: expected a fraction" in out, f"--best 1.5: exit 2 (got {rc}): {out}")
    rc, out = run(root, "main", "new", "--cases", "(")
    check(rc == 2 and "--cases: not a regular expression" in out, f"bad --cases: exit 2 (got {rc}): {out}")

    # a case that failed its check in one round: exit 3, named
    write(d, "bad_1.json", [case(x, "lora_expand", 64, 8, 2, status="fail"), case(y, "lora_shrink", 256, 25, 10)])
    rc, out = run(d, "main", "bad")
    check(rc == 3 and "FAILED in 1 round(s) of bad" in out, f"failing case: exit 3 and named (got {rc}): {out}")
    # a case missing from a variant: exit 3
    write(d, "part_1.json", [case(x, "lora_expand", 64, 8, 2)])
    rc, out = run(d, "main", "part")
    check(rc == 3 and "1 case(s) of main missing in part" in out, f"missing case: exit 3 (got {rc}): {out}")
    # no files for a variant; not a result file; no folder
    rc, out = run(d, "main", "nosuch")
    check(rc == 2 and "nosuch_<round>.json" in out, f"variant without files: exit 2 (got {rc}): {out}")
    with open(os.path.join(d, "junk_1.json"), "w") as f:
        f.write("[1, 2")
    rc, out = run(d, "main", "junk")
    check(rc == 2 and "junk_1.json" in out and "not a punica-bench result" in out, f"bad JSON: exit 2 (got {rc}): {out}")
    rc, out = run(os.path.join(root, "none"), "main", "new")
    check(rc == 2 and "no such folder" in out, f"no folder: exit 2 (got {rc}): {out}")
    # main_x.json is not a round of main (only <name>_<digits>.json are)
    write(d, "main_x.json", [])
    rc, out = run(d, "main", "new")
    check(rc == 0 and "2 / 3 rounds" in out, f"only <name>_<digits>.json files are rounds (got {rc}): {out}")

    # --pair: two single files, the old one gzipped (results/history's form at tag lab-archive)
    import gzip
    with gzip.open(os.path.join(root, "old.json.gz"), "wt") as f:
        json.dump({"cases": [case(x, "lora_expand", 64, 10, 4), case(y, "lora_shrink", 256, 20, 8)]}, f)
    rc, out = run("--pair", os.path.join(root, "old.json.gz"), os.path.join(d, "new_1.json"), "--json",
                  os.path.join(root, "pair.json"))
    check(rc == 0 and "1 / 1 rounds, 2 cases" in out, f"--pair: clean comparison exits 0 (got {rc}): {out}")
    check("0.500 (cold 0.800)" in out and "1.250 (cold 1.250)" in out, "--pair: x and y ratios: " + out)
    with open(os.path.join(root, "pair.json")) as f:
        j = json.load(f)
    check(abs(j["variants"]["new"]["cases"][0]["b2b_ratio"] - 0.5) < 1e-9 or
          abs(j["variants"]["new"]["cases"][1]["b2b_ratio"] - 0.5) < 1e-9, "--pair: JSON ratios")
    rc, out = run("--pair", os.path.join(d, "bad_1.json"), os.path.join(d, "new_1.json"))
    check(rc == 3 and "FAILED in 1 round(s) of old" in out, f"--pair: a failing case exits 3 (got {rc}): {out}")
    rc, out = run("--pair", os.path.join(root, "nosuch.json"), os.path.join(d, "new_1.json"))
    check(rc == 2 and "nosuch.json: no such file" in out, f"--pair: missing file exits 2 (got {rc}): {out}")
    rc, out = run("--pair", os.path.join(d, "junk_1.json"), os.path.join(d, "new_1.json"))
    check(rc == 2 and "not a punica-bench result" in out, f"--pair: bad JSON exits 2 (got {rc}): {out}")
    rc, out = run(d, "main", "new", "--pair", os.path.join(d, "main_1.json"), os.path.join(d, "new_1.json"))
    check(rc == 2 and "takes no DIR" in out, f"--pair with a folder too: exit 2 (got {rc}): {out}")
    rc, out = run()
    check(rc == 2 and "give DIR BASE NEW" in out, f"no arguments: exit 2 (got {rc}): {out}")

sys.exit(finish("ab_compare_test"))
