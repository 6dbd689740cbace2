#!/usr/bin/env python3
"""Compare the variants of a bench A/B (scripts/lab/ab_bench_device.sh) round by round.

    scripts/lab/ab_compare.py DIR BASE NEW [NEW...] [--top N] [--cases REGEX] [--best MARGIN] [--json FILE]

    scripts/lab/ab_compare.py --pair OLD NEW [--top N] [--cases REGEX] [--best MARGIN] [--json FILE]

DIR is the folder that holds the result files `<variant>_<round>.json` (ab_bench_device.sh's
`bench_ab/`), or its parent. --pair compares two single result files instead, as variants `old` and
`new` of one round each (`.json`, or a gzipped `.json.gz` as results/history at tag lab-archive
keeps them), e.g. an installed file against the one it replaced (`git show HEAD~1:results/...`). Per case and variant it takes the median over the rounds of the cold
time (`timing.time_us.median`) and of the back-to-back time (`timing.batch_time_us`), then prints
for each NEW against BASE: the ratio NEW / BASE per (op, tokens) group (median, min, max; back to back
and cold), and the N cases with the lowest and the highest back-to-back ratio. --cases REGEX also
lists every case whose id the regular expression matches (Python `re.search`), in id order.
--best MARGIN (e.g. 0.05) ends with the cases where some NEW beats BASE by at least that fraction back
to back or cold, each with its fastest variant both ways (the other way's ratio beside it): the table
a kernel sweep (scripts/lab/kernel_sweep_device.sh, BASE `auto`) is read from.

Exit status: 0; 2 on bad input (no such folder, a variant without result files, a file that is not
a punica-bench result); 3 when a case did not pass its correctness check in some round of some
variant (the times of a failing variant are not a comparison), or a variant lacks cases that BASE has.
"""
import argparse
import gzip
import json
import os
import re
import signal
import statistics
import sys
import tempfile


def fail(msg, code=2):
    print("ab_compare.py: " + msg, file=sys.stderr)
    sys.exit(code)


def result_dir(d):
    if not os.path.isdir(d):
        fail(f"{d}: no such folder")
    sub = os.path.join(d, "bench_ab")
    return sub if os.path.isdir(sub) else d


def load_variant(d, name):
    """{case id: {"op", "tokens", "cold": [..], "b2b": [..], "failed": rounds}} over the variant's rounds."""
    pat = re.compile(re.escape(name) + r"_\d+\.json")
    files = sorted(os.path.join(d, f) for f in os.listdir(d) if pat.fullmatch(f))
    if not files:
        fail(f"{d}: no result files {name}_<round>.json for variant '{name}'")
    return load_files(files), len(files)


def load_files(files):
    """The cases of result files taken as rounds of one variant (see load_variant)."""
    cases = {}
    for f in files:
        if not os.path.isfile(f):
            fail(f"{f}: no such file")
        try:
            with (gzip.open(f, "rt") if f.endswith(".gz") else open(f)) as fh:
                doc = json.load(fh)
            items = doc["cases"]
        except (OSError, EOFError, ValueError, KeyError, TypeError) as e:
            fail(f"{f}: not a punica-bench result file ({e.__class__.__name__}: expected a JSON object with 'cases')")
        for c in items:
            try:
                cid = c["id"]
                t = c.get("timing") or {}
                e = cases.setdefault(cid, {"op": c.get("op", "?"),
                                           "tokens": (c.get("params") or {}).get("num_tokens", -1),
                                           "cold": [], "b2b": [], "failed": 0})
            except (KeyError, TypeError, AttributeError):
                fail(f"{f}: a case without an 'id'")
            if c.get("status") not in ("pass", "skip"):  # fail / error: punica-bench's other statuses
                e["failed"] += 1
            cold = (t.get("time_us") or {}).get("median")
            if isinstance(cold, (int, float)) and cold > 0:
                e["cold"].append(float(cold))
            b2b = t.get("batch_time_us")
            if isinstance(b2b, (int, float)) and b2b > 0:
                e["b2b"].append(float(b2b))
    return cases


def med(xs):
    return statistics.median(xs) if xs else None


def label(cid):
    """A short name: the case's first two id fields, hidden / slices, tokens, adapters, ranks."""
    parts = cid.split("/")
    keep = parts[:2]
    for p in parts[2:]:
        k = p.split("=", 1)[0]
        if k in ("hidden", "slices", "num_requests", "tokens_per_request", "max_loras", "num_adapters", "ranks"):
            keep.append(p)
    return "/".join(keep)


def compare(base, new):
    rows = []
    for cid, b in base.items():
        n = new.get(cid)
        if n is None:
            continue
        bb, nb, bc, nc = med(b["b2b"]), med(n["b2b"]), med(b["cold"]), med(n["cold"])
        rows.append({"id": cid, "op": b["op"], "tokens": b["tokens"],
                     "b2b_base": bb, "b2b_new": nb, "b2b_ratio": nb / bb if bb and nb else None,
                     "cold_base": bc, "cold_new": nc, "cold_ratio": nc / bc if bc and nc else None})
    return rows


def span(xs):
    xs = [x for x in xs if x is not None]
    if not xs:
        return "-"
    return "%.3f [%.3f..%.3f]" % (statistics.median(xs), min(xs), max(xs))


def f3(v):
    return "%.3f" % v if v is not None else "-"


def f2(v):
    return "%.2f" % v if v is not None else "-"


def best_table(base, base_name, variants, margin):
    """Print and return the cases where a variant's ratio to BASE is <= 1 - margin either way."""
    by_variant = {name: {r["id"]: r for r in v["cases"]} for name, v in variants.items()}
    lim = 1.0 - margin
    hits = []
    for cid in sorted(base, key=lambda c: (base[c]["op"], base[c]["tokens"], c)):
        fastest = {}
        for key in ("b2b_ratio", "cold_ratio"):
            cands = [(rows[cid][key], name) for name, rows in by_variant.items()
                     if cid in rows and rows[cid][key] is not None]
            fastest[key] = min(cands) if cands else None
        if any(f is not None and f[0] <= lim for f in fastest.values()):
            row = {"id": cid, "op": base[cid]["op"], "tokens": base[cid]["tokens"],
                   "b2b_base": med(base[cid]["b2b"]), "cold_base": med(base[cid]["cold"])}
            for key, what in (("b2b_ratio", "b2b"), ("cold_ratio", "cold")):
                if fastest[key] is not None:
                    other = "cold_ratio" if key == "b2b_ratio" else "b2b_ratio"
                    r, name = fastest[key]
                    row["best_" + what] = {"variant": name, "ratio": r, "other_ratio": by_variant[name][cid][other]}
            hits.append(row)
    print(f"== cases where a variant beats {base_name} by >= {margin * 100:g}% ({len(hits)} of {len(base)}): "
          f"fastest back to back (its cold ratio), fastest cold (its back-to-back ratio), {base_name}'s us")
    for h in hits:
        cols = []
        for what in ("b2b", "cold"):
            b = h.get("best_" + what)
            cols.append("%-12s %s (%s)" % (b["variant"], f3(b["ratio"]), f3(b["other_ratio"])) if b else "-")
        print("   %-26s %-26s %8s / %8s us  %s" % (cols[0], cols[1], f2(h["b2b_base"]), f2(h["cold_base"]), label(h["id"])))
    return hits


def main():
    ap = argparse.ArgumentParser(description="Compare the variants of a bench A/B round by round.")
    ap.add_argument("dir", nargs="?", help="folder with <variant>_<round>.json (or its parent holding bench_ab/)")
    ap.add_argument("base", nargs="?", help="the variant the others are compared with")
    ap.add_argument("new", nargs="*", help="variants compared with BASE")
    ap.add_argument("--pair", nargs=2, metavar=("OLD", "NEW"),
                    help="compare two result files (.json or .json.gz) instead of a folder's variants")
    ap.add_argument("--top", type=int, default=8, help="cases listed at each end (default 8)")
    ap.add_argument("--cases", metavar="REGEX", help="also list every case whose id matches (re.search)")
    ap.add_argument("--best", type=float, metavar="MARGIN",
                    help="also list the cases where some variant beats BASE by at least MARGIN (0.05: 5%%), "
                         "with the fastest variant back to back and cold")
    ap.add_argument("--json", help="also write the per-case ratios to this file (atomically)")
    a = ap.parse_args()
    if a.top < 0:
        fail("--top: expected a count >= 0")
    if a.best is not None and not 0 <= a.best < 1:
        fail(f"--best: expected a fraction in [0, 1), not {a.best:g}")
    try:
        sel = re.compile(a.cases) if a.cases is not None else None
    except re.error as e:
        fail(f"--cases: not a regular expression ({e})")
    if a.pair:
        if a.dir is not None:
            fail("--pair OLD NEW takes no DIR / BASE / NEW arguments")
        d, a.base, a.new = None, "old", ["new"]
        files = dict(zip(("old", "new"), a.pair))
        print(f"old: {files['old']}\nnew: {files['new']}")
        load = lambda name: (load_files([files[name]]), 1)
    else:
        if a.dir is None or a.base is None or not a.new:
            fail("give DIR BASE NEW [NEW...], or --pair OLD NEW")
        d = result_dir(a.dir)
        load = lambda name: load_variant(d, name)
    base, base_rounds = load(a.base)
    status = 0
    out = {"dir": d, "base": a.base, "variants": {}}
    if a.pair:
        out["pair"] = a.pair
    for name in a.new:
        new, rounds = load(name)
        rows = compare(base, new)
        missing = len(base) - len(rows)
        print(f"== {name} against {a.base} ({rounds} / {base_rounds} rounds, {len(rows)} cases; ratio {name} / {a.base})")
        if missing:
            print(f"   {missing} case(s) of {a.base} missing in {name}")
            status = 3
        for v, cases in ((a.base, base), (name, new)):
            bad = sorted(cid for cid, c in cases.items() if c["failed"])
            for cid in bad:
                print(f"   FAILED in {cases[cid]['failed']} round(s) of {v}: {cid}")
            if bad:
                status = 3
        groups = {}
        for r in rows:
            groups.setdefault((r["op"], r["tokens"]), []).append(r)
        print("   %-18s %7s %5s  %-26s %-26s" % ("op", "tokens", "cases", "back to back", "cold"))
        for (op, tok) in sorted(groups):
            g = groups[(op, tok)]
            print("   %-18s %7s %5d  %-26s %-26s" % (op, tok, len(g), span(r["b2b_ratio"] for r in g),
                                                    span(r["cold_ratio"] for r in g)))
        ranked = sorted((r for r in rows if r["b2b_ratio"] is not None), key=lambda r: r["b2b_ratio"])
        if a.top and ranked:
            # the highest end leaves out cases the lowest end already lists
            ends = [("lowest", ranked[:a.top]), ("highest", ranked[max(a.top, len(ranked) - a.top):][::-1])]
            for what, rs in (e for e in ends if e[1]):
                print(f"   {what} back-to-back ratios:")
                for r in rs:
                    cold = "%.3f" % r["cold_ratio"] if r["cold_ratio"] is not None else "-"
                    print("   %.3f (cold %s) %8.2f -> %8.2f us  %s" % (r["b2b_ratio"], cold, r["b2b_base"], r["b2b_new"],
                                                                    label(r["id"])))
        if sel is not None:
            hits = sorted((r for r in rows if sel.search(r["id"])), key=lambda r: r["id"])
            print(f"   cases matching --cases ({len(hits)}): back to back ratio, cold ratio, back to back us")
            for r in hits:
                print("   %s %s %8s -> %8s us  %s" % (f3(r["b2b_ratio"]), f3(r["cold_ratio"]), f2(r["b2b_base"]),
                                                     f2(r["b2b_new"]), label(r["id"])))
        out["variants"][name] = {"rounds": rounds, "missing": missing, "cases": rows}
    if a.best is not None:
        out["best"] = best_table(base, a.base, out["variants"], a.best)
    if a.json:
        dst = os.path.abspath(a.json)
        fd, tmp = tempfile.mkstemp(prefix=".ab_compare.", dir=os.path.dirname(dst))
        try:
            with os.fdopen(fd, "w") as fh:
                json.dump(out, fh, indent=1)
            os.replace(tmp, dst)
        except OSError as e:
            os.unlink(tmp)
            fail(f"{a.json}: cannot write ({e})")
    return status


if __name__ == "__main__":
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # `| head` ends it quietly
    sys.exit(main())
