#!/usr/bin/env python3
"""Kernel chains in a timeline from scripts/lab/probes/kernel_trace.cpp (a CUPTI injection library).

Pairs each LAST kernel (default: an expand) with the latest FIRST kernel (default: a shrink) that
started before it on the same stream, in the same CUDA graph or both outside one, and with an
optional LEAD kernel (default: the shrink's zero kernel) right before the FIRST. Per group (the
kernels' names and grids, graph or ordinary launch) it prints medians in microseconds:
  lead, first, last   each kernel's duration (end - start)
  overlap             first.end - last.start: > 0 where the LAST ran while the FIRST was finishing
                      (programmatic dependent launch), < 0 a gap between them
  span                (lead or first).start to last.end: the chain's time on the GPU

  scripts/lab/trace_chain.py TRACE.csv [--first RE] [--last RE] [--lead RE] [--json OUT]

Exit 2 on a file that is not such a CSV (naming the file and the missing column or bad row).
"""
import argparse
import csv
import json
import re
import statistics
import sys

COLUMNS = ["name", "start_ns", "end_ns", "stream", "grid_x", "grid_y", "grid_z", "graph_id"]


def fail(msg):
    print(f"trace_chain.py: {msg}", file=sys.stderr)
    sys.exit(2)


def short_name(name):
    """A readable kernel name: in a mangled name, the first length-prefixed identifier that holds
    'kernel' (shrink_fused_kernel in _ZN6punica7kernels..._119shrink_fused_kernelI...); in a plain one,
    the first word that does; else the name's first 40 characters."""
    if name.startswith("_Z"):
        i = 0
        while i < len(name):
            m = re.match(r"\d+", name[i:])
            if not m:
                i += 1
                continue
            j = i + len(m.group(0))
            ident = name[j:j + int(m.group(0))]
            if "kernel" in ident and ident != "kernels" and len(ident) == int(m.group(0)):
                return ident
            i = j + max(1, len(ident))
    m = re.search(r"\w*kernel\w*", name)
    return m.group(0) if m else name[:40]


def load(path):
    try:
        f = open(path, newline="")
    except OSError as e:
        fail(f"cannot read {path}: {e.strerror}")
    with f:
        rows = csv.DictReader(f)
        missing = [c for c in COLUMNS if c not in (rows.fieldnames or [])]
        if missing:
            fail(f"{path}: no column {missing[0]!r} (expected the header of scripts/lab/probes/kernel_trace.cpp: "
                 f"{','.join(COLUMNS)},...)")
        recs = []
        for i, r in enumerate(rows, start=2):
            try:
                rec = {"name": r["name"], "start": int(r["start_ns"]), "end": int(r["end_ns"]),
                       "stream": int(r["stream"]), "graph": int(r["graph_id"]),
                       "grid": f"{int(r['grid_x'])}x{int(r['grid_y'])}x{int(r['grid_z'])}"}
            except (TypeError, ValueError):
                fail(f"{path}:{i}: start_ns, end_ns, stream, grid_* and graph_id must be integers")
            if rec["end"] < rec["start"]:
                fail(f"{path}:{i}: end_ns {rec['end']} is before start_ns {rec['start']}")
            recs.append(rec)
    return recs


def chains(recs, first_re, last_re, lead_re):
    out = []
    by_lane = {}
    for r in sorted(recs, key=lambda r: r["start"]):
        by_lane.setdefault((r["stream"], r["graph"]), []).append(r)
    for lane in by_lane.values():
        first = lead = None   # the latest unpaired FIRST on this lane, and the LEAD before it
        pending_lead = None   # the latest LEAD not yet followed by a FIRST
        for r in lane:
            if lead_re and lead_re.search(r["name"]):
                pending_lead = r
            elif first_re.search(r["name"]):
                first, lead, pending_lead = r, pending_lead, None
            elif last_re.search(r["name"]) and first is not None:
                out.append({"lead": lead, "first": first, "last": r})
                first = lead = None
    return out


def summarize(found):
    groups = {}
    for c in found:
        f, l, z = c["first"], c["last"], c["lead"]
        key = (short_name(f["name"]), f["grid"], short_name(l["name"]), l["grid"],
               "graph" if f["graph"] else "ordinary")
        g = groups.setdefault(key, {"lead": [], "first": [], "last": [], "overlap": [], "span": []})
        if z is not None:
            g["lead"].append((z["end"] - z["start"]) / 1e3)
        g["first"].append((f["end"] - f["start"]) / 1e3)
        g["last"].append((l["end"] - l["start"]) / 1e3)
        g["overlap"].append((f["end"] - l["start"]) / 1e3)
        g["span"].append((l["end"] - (z or f)["start"]) / 1e3)
    rows = []
    for key, g in sorted(groups.items()):
        med = {k: (statistics.median(v) if v else None) for k, v in g.items()}
        rows.append({"first": key[0], "first_grid": key[1], "last": key[2], "last_grid": key[3], "launch": key[4],
                     "chains": len(g["first"]), **{f"{k}_us": med[k] for k in med}})
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("trace", help="CSV written by scripts/lab/probes/kernel_trace.cpp")
    ap.add_argument("--first", default="shrink", help="regex over the first kernel's name (default: shrink)")
    ap.add_argument("--last", default="expand", help="regex over the last kernel's name (default: expand)")
    ap.add_argument("--lead", default="zero", help="regex over an optional kernel before the first ('' for none)")
    ap.add_argument("--json", help="also write the table as JSON here")
    a = ap.parse_args(argv)
    try:
        res = [re.compile(x) if x else None for x in (a.first, a.last, a.lead)]
    except re.error as e:
        fail(f"bad regular expression: {e}")
    found = chains(load(a.trace), *res)
    if not found:
        fail(f"{a.trace}: no kernel matching --last {a.last!r} follows one matching --first {a.first!r} on a stream")
    rows = summarize(found)
    fmt = lambda v: "-" if v is None else f"{v:8.2f}"
    print(f"{'launch':9s} {'chains':>6s} {'lead':>8s} {'first':>8s} {'last':>8s} {'overlap':>8s} {'span':>8s}  kernels (median us)")
    for r in rows:
        print(f"{r['launch']:9s} {r['chains']:6d} {fmt(r['lead_us'])} {fmt(r['first_us'])} {fmt(r['last_us'])} "
              f"{fmt(r['overlap_us'])} {fmt(r['span_us'])}  {r['first']} {r['first_grid']} -> {r['last']} {r['last_grid']}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
