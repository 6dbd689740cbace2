#!/usr/bin/env python3
"""Test of scripts/install_results.py on synthetic standing-check tarballs (CTest: install_results_script).

Each bad input must exit 2 and leave results/ untouched; a good one must put each new result JSON in
place of its predecessor (no history folder: git keeps the old files), remove the grid shards the new
set lacks, install no logs, and leave every other file (TARGETS.md) alone.
"""
import hashlib
import io
import json
import os
import subprocess
import sys
import tarfile
import tempfile

from script_checks import check, finish  # scripts/script_checks.py

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "install_results.py")


def result_json(sha, dirty=False, tag=""):
    return json.dumps({"schema": "punica-bench.result/1", "tool": {"git_sha": sha, "git_dirty": dirty},
                       "cases": [{"id": "x" + tag, "status": "pass"}]}, indent=1).encode()


def micro_json(sha):
    return json.dumps({"context": {"punica_git_sha": sha}, "benchmarks": []}).encode()


def add(tf, name, data):
    ti = tarfile.TarInfo(name)
    ti.size = len(data)
    tf.addfile(ti, io.BytesIO(data))


def tgz(files):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tf:
        for name, data in files.items():
            add(tf, name, data)
    return buf.getvalue()


def logs(steps):
    return tgz({"logs/steps.txt": steps.encode(), "logs/info.txt": b"info\n"})


def make_parts(d, sha, *, dirty_part=None, bad_step_part=None, other_sha_part=None, skip=(), drop=()):
    """The five tarballs of standing_check.sh parts a and b, written into folder d."""
    os.makedirs(d, exist_ok=True)

    def j(part, tag=""):
        s = "f00dfeedbeef" if part == other_sha_part else sha
        return result_json(s, dirty=(part == dirty_part), tag=tag)

    def lg(part):
        rc = 1 if part == bad_step_part else 0
        return logs(f"10:00:00 rc=0 1s first\n10:00:01 rc={rc} 2s second\n10:00:02 skip third: no case matches x\n")

    grid = tgz({"check_vllm_grid_0.json": j("f", "g0"), "check_vllm_grid_1.json": j("f", "g1")})
    parts = {
        "q": {"q/bench_lora_ops.json": j("q", "b"), "q/check_smoke.json": j("q", "s"), "q/logs.tgz": lg("q"),
              "q.txt": b""},
        "f": {"f/bench_llama3_8b.json": j("f", "8"), "f/bench_sparse_slots.json": j("f", "sp"),
              "f/check_vllm_grid.tgz": grid, "f/logs.tgz": lg("f")},
        "l": {"l/layers_ci_np2.json": j("l", "ci70"), "l/layers_llama_prefill_np2.json": j("l", "p70"),
              "l/layers_llama_decode_np2.json": j("l", "d70"), "l/logs.tgz": lg("l")},
        "l8": {"l8/layers_ci_np2.json": j("l8", "ci"), "l8/layers_llama_prefill_np2.json": j("l8", "p8"),
               "l8/layers_llama_decode_np2.json": j("l8", "d8"), "l8/logs.tgz": lg("l8")},
        "m": {"m/microbench_h200.json": micro_json("f00dfeedbeef" if other_sha_part == "m" else sha),
              "m/microbench_h200_stderr.txt": b"stderr\n", "m/logs.tgz": lg("m")},
    }
    for p, files in parts.items():
        if p in skip:
            continue
        files = {k: v for k, v in files.items() if k not in drop}
        with open(os.path.join(d, p + ".tgz"), "wb") as f:
            f.write(tgz(files))


def make_layer_parts(d, sha, n=4, *, n70=None, skip=(), bad_step=False):
    """The two tarballs of standing_check.sh part x (an n-GPU machine), written into folder d."""
    os.makedirs(d, exist_ok=True)
    n70 = n if n70 is None else n70
    steps = f"10:00:00 rc=0 1s layers_ci\n10:00:01 rc={1 if bad_step else 0} 2s layers_llama_prefill\n"
    parts = {
        "x70": {f"x70/layers_ci_np{n70}.json": result_json(sha, tag="ci70"),
                f"x70/layers_llama_prefill_np{n70}.json": result_json(sha, tag="p70"),
                f"x70/layers_llama_decode_np{n70}.json": result_json(sha, tag="d70"), "x70/logs.tgz": logs(steps)},
        "x8": {f"x8/layers_ci_np{n}.json": result_json(sha, tag="ci"),
               f"x8/layers_llama_prefill_np{n}.json": result_json(sha, tag="p8"),
               f"x8/layers_llama_decode_np{n}.json": result_json(sha, tag="d8"), "x8/logs.tgz": logs(steps)},
    }
    for p, files in parts.items():
        if p not in skip:
            with open(os.path.join(d, p + ".tgz"), "wb") as f:
                f.write(tgz(files))


def check_layers_mode(t, res):
    """--layers: part x's files go to results/h200xN/, replacing the ones there before."""
    first, second = "cccccccccccc", "dddddddddddd"
    before = tree_digest(res)
    bad = {
        "layers: missing x70.tgz": (dict(skip=("x70",)), "missing x70.tgz"),
        "layers: two rank counts": (dict(n70=2), "several rank counts"),
        "layers: failed step": (dict(bad_step=True), "layers_llama_prefill"),
    }
    for name, (kw, msg) in bad.items():
        d = os.path.join(t, name.replace(" ", "_").replace(":", ""))
        make_layer_parts(d, first, **kw)
        r = run(["--layers", d, "--results", res])
        check(r.returncode == 2, f"{name}: exit 2 expected, got {r.returncode} ({r.stderr.strip()})")
        check(msg in r.stderr, f"{name}: message should say {msg!r}: {r.stderr!r}")
        check(tree_digest(res) == before, f"{name}: results/ changed")
    d1, d2 = os.path.join(t, "x_first"), os.path.join(t, "x_second")
    make_layer_parts(d1, first)
    make_layer_parts(d2, second)
    r = run(["--layers", d1, "--results", res])
    check(r.returncode == 0, f"layers install: exit 0 expected, got {r.returncode} ({r.stderr.strip()})")
    for rel, tag in [("h200x4/layers_ci_np4.json", "ci"), ("h200x4/layers_llama70b_prefill_np4.json", "p70"),
                     ("h200x4/layers_llama_decode_np4.json", "d8")]:
        p = os.path.join(res, rel)
        ok = os.path.isfile(p)
        check(ok, f"layers install: {rel} not in place")
        if ok:
            check(f'"x{tag}"' in open(p).read() and first in open(p).read(), f"layers install: {rel} is not part x's {tag}")
    check(sorted(os.listdir(os.path.join(res, "h200x4"))) == sorted(
        f"layers_{k}_np4.json" for k in ["ci", "llama_prefill", "llama_decode", "llama70b_prefill", "llama70b_decode"]),
        "layers install: exactly the five result JSONs (no logs)")
    r = run(["--layers", d2, "--results", res])
    check(r.returncode == 0, f"layers re-install: exit 0 expected, got {r.returncode} ({r.stderr.strip()})")
    check("replaces " + first in r.stdout, f"layers re-install: should say what it replaces: {r.stdout!r}")
    for rel in ["h200x4/layers_ci_np4.json", "h200x4/layers_llama70b_decode_np4.json"]:
        p = os.path.join(res, rel)
        check(os.path.isfile(p) and second in open(p).read(), f"layers re-install: {rel}: the second run's file is not in place")
    check(not os.path.exists(os.path.join(res, "history")), "layers re-install: no history folder")


def keep_installed(t, name, keep, old, new, missing, **parts):
    """Parts made with `parts` (make_parts' bad_step_part / skip) at sha `new` over a results/ tree at
    `old`: refused without --keep (naming `missing`, results/ unchanged), installed with --keep `keep`.
    Returns that results/ tree for the caller's checks of what stayed and what moved."""
    res = os.path.join(t, "results_" + name)
    make_results(res, old)
    d = os.path.join(t, name)
    make_parts(d, new, **parts)
    before = tree_digest(res)
    r = run([d, "--results", res, "--no-plots"])
    check(r.returncode == 2 and missing in r.stderr, f"{name} without --keep: refusal expected ({r.stderr.strip()})")
    check(tree_digest(res) == before, f"{name} without --keep: results/ changed")
    r = run([d, "--results", res, "--no-plots", "--keep", keep])
    check(r.returncode == 0, f"--keep {keep}: exit 0 expected, got {r.returncode} ({r.stderr.strip()})")
    p = os.path.join(res, "h200/bench_lora_ops.json")
    check(os.path.isfile(p) and new in open(p).read(), f"--keep {keep}: the bench file must be the new one")
    check(not os.path.exists(os.path.join(res, "history")), f"--keep {keep}: no history folder")
    return res


def check_keep_micro(t):
    """--keep m: a failed (or absent) microbench part leaves the microbench files where they are; the
    rest installs as usual. Without --keep the failed part is refused."""
    old = "eeeeeeeeeeee"
    res = keep_installed(t, "keep_m", "m", old, "ffffffffffff", "m.tgz", bad_step_part="m")
    p = os.path.join(res, "h200/microbench_h200.json")
    check(os.path.isfile(p) and old in open(p).read(), "--keep m: the microbench file must stay at its old sha")
    d2 = os.path.join(t, "keep_m_absent")
    make_parts(d2, "abababababab", skip=("m",))
    r = run([d2, "--results", res, "--no-plots", "--keep", "m"])
    check(r.returncode == 0, f"--keep m without m.tgz: exit 0 expected, got {r.returncode} ({r.stderr.strip()})")


def check_keep_layers(t):
    """--keep l: parts l and l8 (the 2-GPU layer files) absent, e.g. a check on one GPU: the layer files
    stay at their sha; the rest installs.
    Without --keep the missing parts are refused."""
    old, new = "cccccccccccc", "dddddddddddd"
    res = keep_installed(t, "keep_l", "l", old, new, "l.tgz", skip=("l", "l8"))
    for rel in ["h200x2/layers_ci_np2.json", "h200x2/layers_llama70b_prefill_np2.json"]:
        p = os.path.join(res, rel)
        check(os.path.isfile(p) and old in open(p).read(), f"--keep l: {rel} must stay at its old sha")
    p = os.path.join(res, "h200/microbench_h200.json")
    check(os.path.isfile(p) and new in open(p).read(), "--keep l: the microbench must be the new one")


def check_keep_full(t):
    """--keep f (part q alone, standing_check.sh OUTDIR q): the full profile's files, the vLLM grid
    among them (every shard), stay at their sha; part q's files install.
    Without --keep the missing part is refused."""
    old, new = "a1a1a1a1a1a1", "b2b2b2b2b2b2"
    res = os.path.join(t, "results_keep_f")
    make_results(res, old)
    d = os.path.join(t, "keep_f")
    make_parts(d, new, skip=("f", "l", "l8", "m"))  # what part q leaves on one GPU
    before = tree_digest(res)
    for keeps, missing in [([], "f.tgz"), (["l", "m"], "f.tgz"), (["f"], "l.tgz")]:
        r = run([d, "--results", res, "--no-plots"] + [x for k in keeps for x in ("--keep", k)])
        check(r.returncode == 2 and missing in r.stderr, f"--keep {keeps}: refusal naming {missing} expected ({r.stderr.strip()})")
        check(tree_digest(res) == before, f"--keep {keeps}: results/ changed")
    r = run([d, "--results", res, "--no-plots", "--keep", "f", "--keep", "l", "--keep", "m"])
    check(r.returncode == 0, f"--keep f --keep l --keep m: exit 0 expected, got {r.returncode} ({r.stderr.strip()})")
    for rel in ["h200/bench_llama3_8b.json", "h200/check_vllm_grid/check_vllm_grid_0.json",
                "h200/check_vllm_grid/check_vllm_grid_2.json"]:
        p = os.path.join(res, rel)
        check(os.path.isfile(p) and old in open(p).read(), f"--keep f: {rel} must stay at its old sha")
    for rel in ["h200/bench_lora_ops.json", "h200/check_smoke.json"]:
        p = os.path.join(res, rel)
        check(os.path.isfile(p) and new in open(p).read(), f"--keep f: {rel} must be the new one")
    check(not os.path.exists(os.path.join(res, "history")), "--keep f: no history folder")


def make_results(r, sha):
    """A results/ tree at `sha`, as install_results.py leaves one."""
    files = {
        "h200/bench_lora_ops.json": result_json(sha, tag="b"), "h200/check_smoke.json": result_json(sha, tag="s"),
        "h200/bench_llama3_8b.json": result_json(sha, tag="8"), "h200/microbench_h200.json": micro_json(sha),
        "h200/check_vllm_grid/check_vllm_grid_0.json": result_json(sha, tag="g0"),
        "h200/check_vllm_grid/check_vllm_grid_2.json": result_json(sha, tag="g2"),
        "h200/plots/floor_fraction.png": b"png", "h200x2/layers_ci_np2.json": result_json(sha, tag="ci"),
        "h200x2/layers_llama_prefill_np2.json": result_json(sha, tag="p8"),
        "h200x2/layers_llama_decode_np2.json": result_json(sha, tag="d8"),
        "h200x2/layers_llama70b_prefill_np2.json": result_json(sha, tag="p70"),
        "h200x2/layers_llama70b_decode_np2.json": result_json(sha, tag="d70"),
        "TARGETS.md": b"# targets\n",
    }
    for rel, data in files.items():
        p = os.path.join(r, rel)
        os.makedirs(os.path.dirname(p), exist_ok=True)
        with open(p, "wb") as f:
            f.write(data)
    return files


def tree_digest(root):
    h = hashlib.sha256()
    for dp, _, fs in sorted(os.walk(root)):
        for f in sorted(fs):
            p = os.path.join(dp, f)
            h.update(os.path.relpath(p, root).encode())
            with open(p, "rb") as fh:
                h.update(fh.read())
    return h.hexdigest()


def run(args):
    return subprocess.run([sys.executable, SCRIPT] + args, capture_output=True, text=True)


def main():
    old, new = "aaaaaaaaaaaa", "bbbbbbbbbbbb"
    with tempfile.TemporaryDirectory() as t:
        res = os.path.join(t, "results")
        old_files = make_results(res, old)
        before = tree_digest(res)

        bad = {
            "missing m.tgz": dict(skip=("m",)),
            "dirty": dict(dirty_part="l8"),
            "failed step": dict(bad_step_part="f"),
            "two shas": dict(other_sha_part="m"),
            "file missing": dict(drop=("l8/layers_ci_np2.json",)),
        }
        for name, kw in bad.items():
            d = os.path.join(t, "bad_" + name.replace(" ", "_"))
            make_parts(d, new, **kw)
            r = run([d, "--results", res, "--no-plots"])
            check(r.returncode == 2, f"{name}: exit 2 expected, got {r.returncode} ({r.stderr.strip()})")
            check(r.stderr.startswith("install_results: "), f"{name}: an install_results message expected: {r.stderr!r}")
            check(tree_digest(res) == before, f"{name}: results/ changed")
        # the messages name what is wrong
        r = run([os.path.join(t, "bad_dirty"), "--results", res, "--no-plots"])
        check("git_dirty" in r.stderr and "layers_ci_np2.json" in r.stderr, "dirty: message names the file and field: " + r.stderr)
        r = run([os.path.join(t, "bad_failed_step"), "--results", res, "--no-plots"])
        check("f.tgz" in r.stderr and "rc=1" in r.stderr and "second" in r.stderr, "failed step: message names it: " + r.stderr)
        r = run([os.path.join(t, "bad_file_missing"), "--results", res, "--no-plots"])
        check("l8.tgz: no l8/layers_ci_np2.json" in r.stderr, "file missing: message names tarball and file: " + r.stderr)
        r = run([os.path.join(t, "bad_two_shas"), "--results", res, "--no-plots"])
        check("f00dfeedbeef" in r.stderr and "microbench_h200.json" in r.stderr, "two shas: message names both: " + r.stderr)

        # split over two folders (parts a and b), dry run first
        a_dir, b_dir = os.path.join(t, "a"), os.path.join(t, "b")
        make_parts(a_dir, new, skip=("l8", "m"))
        make_parts(b_dir, new, skip=("q", "f", "l"))
        r = run([a_dir, b_dir, "--results", res, "--no-plots", "--dry-run"])
        check(r.returncode == 0, f"dry run: exit 0 expected, got {r.returncode} ({r.stderr.strip()})")
        check(tree_digest(res) == before, "dry run: results/ changed")
        r = run([a_dir, b_dir, "--results", res, "--no-plots"])
        check(r.returncode == 0, f"install: exit 0 expected, got {r.returncode} ({r.stderr.strip()})")

        check("replaces " + old in r.stdout and "check_vllm_grid_2.json removed" in r.stdout,
              f"install: should say what it replaces and removes: {r.stdout!r}")
        for rel in ["h200/bench_lora_ops.json", "h200/check_smoke.json", "h200/bench_llama3_8b.json",
                    "h200/bench_sparse_slots.json", "h200/check_vllm_grid/check_vllm_grid_0.json",
                    "h200/check_vllm_grid/check_vllm_grid_1.json", "h200x2/layers_llama70b_prefill_np2.json",
                    "h200x2/layers_ci_np2.json", "h200/microbench_h200.json"]:
            p = os.path.join(res, rel)
            check(os.path.isfile(p) and new in open(p).read(), f"{rel}: the new file is not in place")
        p = os.path.join(res, "h200x2/layers_ci_np2.json")
        check(os.path.isfile(p) and '"xci"' in open(p).read(), "layers_ci_np2.json must be the 8B call's (l8), not the 70B call's")
        check(not os.path.exists(os.path.join(res, "h200/check_vllm_grid/check_vllm_grid_2.json")),
              "the grid shard the new set lacks must be removed")
        check(not os.path.exists(os.path.join(res, "history")), "no history folder: git keeps the old files")
        check(open(os.path.join(res, "TARGETS.md"), "rb").read() == old_files["TARGETS.md"], "TARGETS.md must stay")
        left = sorted(os.path.relpath(os.path.join(dp, f), res) for dp, _, fs in os.walk(res) for f in fs)
        check(not [f for f in left if not (f.endswith(".json") or f.endswith(".png") or f == "TARGETS.md")],
              f"only result JSON, plots and TARGETS.md expected in results/: {left}")

        # a second install of the same files changes nothing
        after = tree_digest(res)
        r = run([a_dir, b_dir, "--results", res, "--no-plots"])
        check(r.returncode == 0, f"re-install: exit 0 expected ({r.returncode}, {r.stderr.strip()})")
        check(tree_digest(res) == after, "re-install: results/ changed")

        check_keep_micro(t)
        check_keep_layers(t)
        check_keep_full(t)
        check_layers_mode(t, res)

    return finish("install_results_test")


if __name__ == "__main__":
    sys.exit(main())
