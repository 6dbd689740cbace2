#!/usr/bin/env python3
"""One line per kernel launch of Nsight Compute text reports (`ncu --set full` details pages, as
scripts/lab/ncu_device.sh writes them; the launches in file order).

    scripts/lab/ncu_summary.py REPORT.txt [REPORT.txt ...] [--json OUT]

Columns: the report's file name, the kernel (its short name: the demangled or mangled name without
namespaces, template arguments and parameters), grid x block, duration (us), DRAM throughput (% of
peak), achieved / theoretical occupancy (%), eligible warps and issued warps per scheduler per cycle,
registers per thread, dynamic shared memory per block (KB), waves per SM and local-memory spill
requests. A metric the report lacks reads '-' (null in the JSON). Exit 2 when a file cannot be read
or holds no kernel launch.
"""
import json
import os
import re
import sys

# "  NAME (gx, gy, gz)x(bx, by, bz), Context 1, Stream 13, Device 0, CC 9.0"
LAUNCH = re.compile(r"^  (\S.*?) \((\d+), (\d+), (\d+)\)x\((\d+), (\d+), (\d+)\), Context ")
# "    Duration                         us        41.73"  (name, optional unit, value)
METRIC = re.compile(r"^    (\S.*?)\s{2,}(?:(\S+)\s+)?([-+]?[\d,]*\.?\d+)\s*$")
WANTED = {
    "Duration": "duration_us",
    "DRAM Throughput": "dram_pct",
    "Achieved Occupancy": "achieved_occupancy_pct",
    "Theoretical Occupancy": "theoretical_occupancy_pct",
    "Eligible Warps Per Scheduler": "eligible_warps",
    "Issued Warp Per Scheduler": "issued_warps",
    "Registers Per Thread": "registers",
    "Dynamic Shared Memory Per Block": "dynamic_smem_kb",
    "Waves Per SM": "waves",
    "Local Memory Spilling Requests": "spill_requests",
}
TIME_US = {"ns": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3, "s": 1e6, "second": 1e6}
BYTES_KB = {"byte/block": 1 / 1024, "Kbyte/block": 1.0, "Mbyte/block": 1024.0}


def die(msg):
    print("ncu_summary.py: " + msg, file=sys.stderr)
    sys.exit(2)


def short_name(name):
    """'void ns::k<int, 2>(P)' / '_ZN6punica7kernels18shrink_zero_kernelEPfl' -> the kernel's own name."""
    if name.startswith("_Z"):  # mangled: the last <length><identifier> of the (nested) name
        i, last = 2, None
        if name.startswith("_ZN"):
            i = 3
        while i < len(name):
            while i < len(name) and name[i] in "LK":  # internal linkage / const qualifiers
                i += 1
            m = re.match(r"\d+", name[i:])
            if not m:
                break
            n = int(m.group(0))
            i += len(m.group(0))
            last = name[i:i + n]
            i += n
            if not name.startswith("_ZN"):  # a plain _Z<len><id>: one identifier only
                break
        return last or name
    base = name.split("(")[0]
    depth, out = 0, ""
    for ch in base:  # drop template arguments
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth -= 1
        elif depth == 0:
            out += ch
    return out.split()[-1].split("::")[-1] if out.split() else name


def parse(path):
    try:
        with open(path, errors="replace") as f:
            lines = f.read().splitlines()
    except OSError as e:
        die(f"cannot read {path}: {e.strerror}")
    rows, cur = [], None
    for line in lines:
        m = LAUNCH.match(line)
        if m:
            g, b = tuple(int(x) for x in m.group(2, 3, 4)), tuple(int(x) for x in m.group(5, 6, 7))
            cur = {"report": os.path.basename(path), "kernel": short_name(m.group(1)), "name": m.group(1),
                   "grid": list(g), "block": list(b)}
            cur.update({k: None for k in WANTED.values()})
            rows.append(cur)
            continue
        if cur is None:
            continue
        m = METRIC.match(line)
        if not m or m.group(1).strip() not in WANTED:
            continue
        key, unit = WANTED[m.group(1).strip()], m.group(2) or ""
        if cur[key] is not None:  # a metric name repeated in a later section: the first one counts
            continue
        v = float(m.group(3).replace(",", ""))
        if key == "duration_us":
            if unit not in TIME_US:
                die(f"{path}: duration in unknown unit '{unit}'")
            v *= TIME_US[unit]
        elif key == "dynamic_smem_kb":
            if unit not in BYTES_KB:
                die(f"{path}: shared memory in unknown unit '{unit}'")
            v *= BYTES_KB[unit]
        cur[key] = v
    if not rows:
        die(f"{path}: no kernel launch found (is it an `ncu` details page?)")
    return rows


def fmt(v, spec):
    return "-" if v is None else format(v, spec)


def main(argv):
    args, out = [], None
    it = iter(argv)
    for a in it:
        if a == "--json":
            out = next(it, None)
            if out is None:
                die("--json needs a file name")
        elif a in ("-h", "--help"):
            print(__doc__)
            return 0
        else:
            args.append(a)
    if not args:
        die("usage: ncu_summary.py REPORT.txt [REPORT.txt ...] [--json OUT]")
    rows = [r for p in args for r in parse(p)]
    print(f"{'report':<34} {'kernel':<26} {'grid x block':>16} {'us':>8} {'DRAM%':>6} {'occ%':>11} "
          f"{'elig':>5} {'issue':>5} {'regs':>4} {'smemKB':>7} {'waves':>6} {'spills':>6}")
    for r in rows:
        gb = f"{r['grid'][0] * r['grid'][1] * r['grid'][2]}x{r['block'][0] * r['block'][1] * r['block'][2]}"
        occ = f"{fmt(r['achieved_occupancy_pct'], '.1f')}/{fmt(r['theoretical_occupancy_pct'], '.1f')}"
        print(f"{r['report'][:34]:<34} {r['kernel'][:26]:<26} {gb:>16} {fmt(r['duration_us'], '8.2f')} "
              f"{fmt(r['dram_pct'], '6.1f')} {occ:>11} {fmt(r['eligible_warps'], '5.2f')} "
              f"{fmt(r['issued_warps'], '5.2f')} {fmt(r['registers'], '4.0f')} {fmt(r['dynamic_smem_kb'], '7.1f')} "
              f"{fmt(r['waves'], '6.2f')} {fmt(r['spill_requests'], '6.0f')}")
    if out:
        tmp = out + ".part"
        with open(tmp, "w") as f:
            json.dump({"schema": "punica-bench.ncu-summary/1", "launches": rows}, f, indent=1)
        os.replace(tmp, out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
