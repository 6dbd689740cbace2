#!/usr/bin/env python3
"""Test of scripts/plot_results.py without matplotlib (CTest: plot_results_script).

On a machine whose interpreter lacks matplotlib the script must say so, name the package to install
and exit 4 (cannot run here), not end in a ModuleNotFoundError traceback. matplotlib is hidden by a
package of that name on PYTHONPATH whose import fails.
"""
import os
import subprocess
import sys
import tempfile

from script_checks import check, finish  # scripts/script_checks.py

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "plot_results.py")


def main():
    with tempfile.TemporaryDirectory() as t:
        os.makedirs(os.path.join(t, "matplotlib"))
        with open(os.path.join(t, "matplotlib", "__init__.py"), "w") as f:
            f.write('raise ImportError("No module named \'matplotlib\' (hidden by plot_results_test.py)")\n')
        env = dict(os.environ, PYTHONPATH=t + os.pathsep + os.environ.get("PYTHONPATH", ""))
        p = subprocess.run([sys.executable, SCRIPT, os.path.join(t, "r.json"), "-o", os.path.join(t, "plots")],
                           capture_output=True, text=True, env=env)
        check(p.returncode == 4, f"without matplotlib: exit 4 expected, got {p.returncode} ({p.stderr.strip()})")
        check("python3-matplotlib" in p.stderr and "Traceback" not in p.stderr,
              f"without matplotlib: a message naming python3-matplotlib expected, no traceback: {p.stderr!r}")
        check(not os.path.exists(os.path.join(t, "plots")), "without matplotlib: nothing written")
    return finish("plot_results_test")


if __name__ == "__main__":
    sys.exit(main())
