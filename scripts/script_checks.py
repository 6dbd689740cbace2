"""The failed-check list shared by the CPU tests of scripts/ (install_results_test.py,
plot_results_test.py) and scripts/lab/ (ab_compare_test.py, ab_device_test.py, ncu_device_test.py,
ncu_summary_test.py, sparse_report_test.py, trace_chain_test.py): each check prints what failed and
the test ends with `finish`, whose exit status is 1 when any check failed. Imported from scripts/
(Python puts a script's folder first on sys.path; the lab's tests add their parent folder)."""
import subprocess
import sys

failures = []


def run_script(script, *args):
    """Run a Python script with ARGS: (exit status, stdout + stderr)."""
    p = subprocess.run([sys.executable, script, *args], capture_output=True, text=True)
    return p.returncode, p.stdout + p.stderr


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL: " + what)
    return bool(cond)


def finish(name):
    """Print the outcome and return the exit status (0 when every check passed)."""
    if failures:
        print(f"{name}: {len(failures)} check(s) failed")
        return 1
    print(f"{name}: all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit("script_checks.py is a module for the scripts' tests, not a program")
