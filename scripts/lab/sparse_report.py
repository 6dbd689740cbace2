#!/usr/bin/env python3
"""The few-adapters-in-many-slots regime from a result file of scenarios/bench_sparse_slots.json.

    scripts/lab/sparse_report.py SPARSE.json [BENCH.json]

For every `*_hinted` case (the op got the batch's distinct adapters as num_active_loras) and its
plain twin (the same case without the hint, the same run): the ratio hinted / plain, back to back
(`timing.batch_time_us`) and cold (`timing.time_us.median`), as median [min..max] per op and token
count. With BENCH.json (scenarios/bench_lora_ops.json's result) also the hinted cases against the
bench's case of the same op, shape, tokens and ranks whose max_loras equals their num_adapters (a
full batch of those adapters): how far the hint takes the regime. Then the cases where the hint is
slower. Only passing cases count. Exit 2 on a file that is not such a result.
"""
import json
import statistics
import sys


def die(msg):
    print(f"sparse_report.py: {msg}", file=sys.stderr)
    sys.exit(2)


def load(path):
    try:
        with open(path) as f:
            doc = json.load(f)
        return [c for c in doc["cases"] if c.get("status") == "pass"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        die(f"{path}: not a punica-bench result ({e})")


def times(c):
    t = c["timing"]
    return t["batch_time_us"], t["time_us"]["median"]


def shape_key(c, loras):
    """A case's op, shape, tokens and ranks with `loras` adapter slots: a hinted case's key with its
    num_adapters matches the bench's case with that max_loras."""
    q = c["params"]
    return (c["op"], q["hidden"], tuple(q["slices"]), q["num_tokens"], tuple(q["ranks"]), loras)


def plain_id(case_id):
    first, rest = case_id.split("/", 1)
    return first[: -len("_hinted")] + "/" + rest.replace("/active_loras_hint=1", "")


def summary(rows, label):
    """rows: (op, tokens, b2b ratio, cold ratio, case id, a_b2b, b_b2b)."""
    print(f"== {label}")
    print(f"   {'op':<18}{'tokens':>7}{'cases':>6}  {'back to back':<26}{'cold':<26}")
    for key in sorted({(r[0], r[1]) for r in rows}):
        sel = [r for r in rows if (r[0], r[1]) == key]
        b = [r[2] for r in sel]
        c = [r[3] for r in sel]
        print(f"   {key[0]:<18}{key[1]:>7}{len(sel):>6}  "
              f"{statistics.median(b):.3f} [{min(b):.3f}..{max(b):.3f}]      "
              f"{statistics.median(c):.3f} [{min(c):.3f}..{max(c):.3f}]")


def main(argv):
    if len(argv) not in (2, 3) or argv[1] in ("-h", "--help"):
        print(__doc__.strip())
        return 0 if len(argv) == 2 and argv[1] in ("-h", "--help") else 2
    cases = load(argv[1])
    by_id = {c["id"]: c for c in cases}
    hinted = [c for c in cases if c["id"].split("/", 1)[0].endswith("_hinted")]
    if not hinted:
        die(f"{argv[1]}: no passing *_hinted case (is it bench_sparse_slots' result?)")
    rows = []
    for h in hinted:
        p = by_id.get(plain_id(h["id"]))
        if p is None:
            continue
        hb, hc = times(h)
        pb, pc = times(p)
        rows.append((h["op"], h["params"]["num_tokens"], hb / pb, hc / pc, h["id"], pb, hb))
    if not rows:
        die(f"{argv[1]}: no hinted case has its plain twin")
    summary(rows, f"hinted / plain ({len(rows)} pairs)")
    slower = sorted((r for r in rows if r[2] > 1.02), key=lambda r: -r[2])
    print(f"   hinted slower than plain back to back (> 1.02): {len(slower)}")
    for r in slower:
        print(f"   {r[2]:.3f} (cold {r[3]:.3f}) {r[5]:9.2f} -> {r[6]:9.2f} us  {r[4]}")
    if len(argv) == 3:
        bench = load(argv[2])
        index = {shape_key(c, c["params"]["max_loras"]): c for c in bench}
        twins = []
        for h in hinted:
            d = index.get(shape_key(h, h["params"]["num_adapters"]))
            if d is None:
                continue
            hb, hc = times(h)
            db, dc = times(d)
            twins.append((h["op"], h["params"]["num_tokens"], hb / db, hc / dc, h["id"], db, hb))
        if twins:
            summary(twins, f"hinted / the bench's full batch of the same adapters ({len(twins)} pairs)")
        else:
            print("== no hinted case has a bench twin (max_loras = its num_adapters)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
