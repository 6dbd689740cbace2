#!/usr/bin/env python3
"""Put a standing check's output under results/ (never editing a result file).

    scripts/install_results.py DIR [DIR...] [--results results] [--dry-run] [--no-plots] [--keep m|l|f]

DIRs hold the tarballs of `scripts/standing_check.sh` (parts a and b): q.tgz, f.tgz, l.tgz, l8.tgz,
m.tgz, all five required. With --layers they hold its part x instead (x70.tgz, x8.tgz: the layer
scenarios under `mpirun -np N` on an N-GPU machine), installed into results/h200xN/. Before
anything changes it checks that every result JSON in them names one git sha, clean, and that every
step of every profile exited 0 (logs/steps.txt). Then each new result JSON replaces its predecessor
in place (git keeps the old one; results/ holds only the newest file per machine and scenario), grid
shards the new set lacks are removed, and the plots are redrawn from the new bench file. The logs
stay in the tarballs; they are not installed. Exit 2 on bad input, nothing changed.
--keep m installs without part b's microbench (m.tgz may be absent or failed): the microbench file
in results/h200 stays, at the sha it names. --keep l likewise keeps the 2-GPU layer files (parts l
and l8, results/h200x2/), e.g. for a check on a 1-GPU machine, where the tp 2 cases cannot run.
--keep f keeps the full profile's files (the vLLM grid, bench_llama3_8b, bench_sparse_slots), e.g.
after a call that had time for part q only (`standing_check.sh OUTDIR q`).
"""
import argparse
import functools
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile

PARTS = ["q", "f", "l", "l8", "m"]
KEEP = {"m": ["m"], "l": ["l", "l8"], "f": ["f"]}  # --keep NAME: the parts it leaves in place

# The layer files of one machine's `device_check.sh layers` calls (70B filter in part p70, 8B
# filter in part p8, whose layers_ci JSON is the one kept) -> results/h200x<n>/. Parts l / l8 of
# the standing check on the 2-GPU host, parts x70 / x8 (--layers) on an n-GPU machine.
def layer_places(n, p70, p8):
    return [
        (p70, f"layers_llama_prefill_np{n}.json", f"h200x{n}/layers_llama70b_prefill_np{n}.json"),
        (p70, f"layers_llama_decode_np{n}.json", f"h200x{n}/layers_llama70b_decode_np{n}.json"),
        (p8, f"layers_ci_np{n}.json", f"h200x{n}/layers_ci_np{n}.json"),
        (p8, f"layers_llama_prefill_np{n}.json", f"h200x{n}/layers_llama_prefill_np{n}.json"),
        (p8, f"layers_llama_decode_np{n}.json", f"h200x{n}/layers_llama_decode_np{n}.json"),
    ]


# --layers (standing_check.sh part x on an N-GPU machine)
LAYER_PARTS = ["x70", "x8"]

# (part, file in the part's folder) -> path under results/
PLACES = [
    ("q", "bench_lora_ops.json", "h200/bench_lora_ops.json"),
    ("q", "check_smoke.json", "h200/check_smoke.json"),
    ("f", "bench_llama3_8b.json", "h200/bench_llama3_8b.json"),
    ("f", "bench_sparse_slots.json", "h200/bench_sparse_slots.json"),
    *layer_places(2, "l", "l8"),
    ("m", "microbench_h200.json", "h200/microbench_h200.json"),
]
GRID = "h200/check_vllm_grid"



def layer_np(tmp):
    """N of the layer files of part x (layers_ci_npN.json in x8/, the same N in x70/)."""
    ns = set()
    for p in LAYER_PARTS:
        for f in os.listdir(os.path.join(tmp, p)):
            if f.startswith("layers_") and f.endswith(".json") and "_np" in f:
                tail = f[f.rindex("_np") + 3:-len(".json")]
                if not tail.isdigit():
                    die(f"{p}.tgz: {p}/{f}: expected a name ending in _np<ranks>.json")
                ns.add(int(tail))
    if len(ns) != 1:
        die("part x's layer files name " + ("no" if not ns else "several") + " rank counts (_np<N>.json): "
            + ", ".join(map(str, sorted(ns))) + "; expected one N from one machine")
    n = ns.pop()
    if n < 2:
        die(f"part x's layer files are from np {n}: expected 2 or more ranks")
    return n


def die(msg):
    print("install_results: " + msg, file=sys.stderr)
    sys.exit(2)


@functools.lru_cache(maxsize=None)  # each file is read once
def sha_of(path):
    """(sha, dirty) a result file names: tool.git_sha of punica-bench's JSON, context.punica_git_sha
    of the microbench's (Google Benchmark JSON, no dirty flag)."""
    try:
        with open(path) as f:
            d = json.load(f)
    except (OSError, ValueError) as e:
        die(f"{path}: not readable JSON ({e})")
    if isinstance(d.get("tool"), dict) and "git_sha" in d["tool"]:
        return d["tool"]["git_sha"], bool(d["tool"].get("git_dirty", False))
    ctx = d.get("context", {})
    if "punica_git_sha" in ctx:
        return ctx["punica_git_sha"], False
    die(f"{path}: names no git sha (field tool.git_sha or context.punica_git_sha expected)")


def write_atomic(path, data):
    """`data` at `path` through a .part file renamed over it: never half-written."""
    with open(path + ".part", "wb") as fo:
        fo.write(data)
    os.replace(path + ".part", path)


def steps_ok(part, folder):
    """Every step of device_check.sh exited 0 (or was a skip with a reason): its logs/steps.txt, inside
    the logs.tgz that device_check.sh leaves."""
    logs = os.path.join(folder, "logs.tgz")
    try:
        with tarfile.open(logs) as tf:
            text = tf.extractfile("logs/steps.txt").read().decode()
    except (OSError, KeyError, AttributeError, tarfile.TarError) as e:
        die(f"{part}.tgz: no logs.tgz with logs/steps.txt ({e}): the profile did not run")
    bad = [ln.strip() for ln in text.splitlines() if ln.strip() and " rc=0 " not in ln and " skip " not in ln]
    if bad:
        die(f"{part}.tgz: logs/steps.txt has steps that did not exit 0: " + "; ".join(bad))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dirs", nargs="+", help="folders with q.tgz f.tgz l.tgz l8.tgz m.tgz (--layers: x70.tgz x8.tgz)")
    ap.add_argument("--layers", action="store_true",
                    help="install standing_check.sh part x (multi-GPU layer files) into results/h200xN/")
    ap.add_argument("--results", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "results"))
    ap.add_argument("--dry-run", action="store_true", help="check and say what would move; move nothing")
    ap.add_argument("--no-plots", action="store_true", help="leave results/h200/plots to scripts/plot_results.py")
    ap.add_argument("--keep", action="append", default=[], choices=sorted(KEEP),
                    help="leave these parts' files in results/ as they are (m: the microbench, e.g. after its step "
                         "ran past its cap; l: the 2-GPU layer files of parts l and l8, e.g. after a check on one "
                         "GPU; f: the full profile's files, the vLLM grid, bench_llama3_8b, bench_sparse_slots and their "
                         "logs, e.g. after part q alone); their tarballs are then neither needed nor read")
    a = ap.parse_args()
    if a.layers and a.keep:
        die("--keep applies to parts a / b, not to --layers")
    res = os.path.abspath(a.results)
    if not os.path.isdir(os.path.join(res, "h200")):
        die(f"{res}: no h200/ folder (give --results)")

    keep = {p for k in a.keep for p in KEEP[k]}
    parts = LAYER_PARTS if a.layers else [p for p in PARTS if p not in keep]
    tarballs = {}
    for d in a.dirs:
        for p in parts:
            t = os.path.join(d, p + ".tgz")
            if os.path.isfile(t):
                if p in tarballs:
                    die(f"{p}.tgz found twice: {tarballs[p]} and {t}")
                tarballs[p] = t
    missing = [p + ".tgz" for p in parts if p not in tarballs]
    if missing:
        die("missing " + ", ".join(missing) + (" (scripts/standing_check.sh part x makes both)" if a.layers else
                                                " (scripts/standing_check.sh parts a and b make all five)"))

    tmp = tempfile.mkdtemp(prefix="install_results.")
    try:
        for p, t in tarballs.items():
            with tarfile.open(t) as tf:
                for m in tf.getmembers():
                    if m.name.startswith("/") or ".." in m.name.split("/"):
                        die(f"{t}: unsafe member {m.name}")
                tf.extractall(tmp)
            if not os.path.isdir(os.path.join(tmp, p)):
                die(f"{t}: holds no folder {p}/")
            steps_ok(p, os.path.join(tmp, p))
        if a.layers:
            n = layer_np(tmp)
            places, grid, gdir, new_grid = layer_places(n, *LAYER_PARTS), [], None, False
        else:
            places = [pl for pl in PLACES if pl[0] in parts]
            grid, gdir = [], None
            new_grid = "f" not in keep  # the vLLM grid comes with part f (--keep f: it stays)
            if new_grid:
                grid_tgz = os.path.join(tmp, "f", "check_vllm_grid.tgz")
                if not os.path.isfile(grid_tgz):
                    die(f"{tarballs['f']}: no check_vllm_grid.tgz")
                gdir = os.path.join(tmp, "grid")
                os.makedirs(gdir)
                with tarfile.open(grid_tgz) as tf:
                    for m in tf.getmembers():
                        if not (m.isfile() and m.name.endswith(".json") and "/" not in m.name):
                            die(f"{grid_tgz}: unexpected member {m.name}")
                    tf.extractall(gdir)
                grid = sorted(os.listdir(gdir))
                if not grid:
                    die(f"{grid_tgz}: no shard JSON")

        # every new result: one sha, clean
        new = []
        for p, f, dst in places:
            src = os.path.join(tmp, p, f)
            if not os.path.isfile(src):
                die(f"{tarballs[p]}: no {p}/{f}")
            new.append((src, dst))
        new += [(os.path.join(gdir, g), f"{GRID}/{g}") for g in grid]  # listed from the folder: present
        shas = {}
        for src, dst in new:
            if src.endswith(".json"):
                sha, dirty = sha_of(src)
                if dirty:
                    die(f"{dst}: measured a dirty tree (tool.git_dirty true)")
                shas.setdefault(sha, []).append(dst)
        if len(shas) != 1:
            die("the new files name more than one git sha: " + "; ".join(f"{s}: {', '.join(v)}" for s, v in shas.items()))
        new_sha = next(iter(shas))

        # what each new file replaces (git keeps the old one), and the grid shards the new set lacks
        replaced, stale = [], []
        for _, dst in new:
            p = os.path.join(res, dst)
            replaced.append((dst, sha_of(p)[0][:12] if os.path.isfile(p) else None))
        if new_grid and os.path.isdir(os.path.join(res, GRID)):
            stale = sorted(f"{GRID}/{g}" for g in os.listdir(os.path.join(res, GRID)) if g not in grid)

        print(f"new files: {len(new)} at {new_sha}")
        for dst, old in replaced:
            print(f"  results/{dst}" + (f" (replaces {old})" if old else " (new)"))
        for rel in stale:
            print(f"  results/{rel} removed (not in the new grid)")
        if a.dry_run:
            return 0

        for src, dst in new:
            d = os.path.join(res, dst)
            os.makedirs(os.path.dirname(d), exist_ok=True)
            with open(src, "rb") as fi:
                write_atomic(d, fi.read())
        for rel in stale:
            os.remove(os.path.join(res, rel))
        done = f"installed {len(new)} files at {new_sha}, replacing {sum(1 for _, o in replaced if o)}"
        if a.layers or a.no_plots:
            print(done + ("" if a.layers else " (plots not redrawn)"))
            return 0
        plot = os.path.join(os.path.dirname(os.path.abspath(__file__)), "plot_results.py")
        # plot_results.py needs matplotlib, which this interpreter may lack (Debian's python3 has it)
        py = sys.executable
        if subprocess.call([py, "-c", "import matplotlib"], stderr=subprocess.DEVNULL) != 0 and os.path.exists("/usr/bin/python3"):
            py = "/usr/bin/python3"
        rc = subprocess.call([py, plot, os.path.join(res, "h200/bench_lora_ops.json"), "-o",
                              os.path.join(res, "h200/plots")])
        if rc != 0:
            print("install_results: plot_results.py failed (rc %d); the results are in place, the plots are not" % rc,
                  file=sys.stderr)
            return 1
        print(done)
        return 0
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
