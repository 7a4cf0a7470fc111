"""Where the test suite's time goes: wall and CPU seconds per test, summed per file.

Wall time on a shared 2-core machine says as much about the neighbours as about the suite; the CPU
seconds of a test's whole process tree (pytest, its ranks, launchers, compilers) do not. As a
pytest plugin this module appends one line per test to a TSV file; run as a script it sums that
file per test file and prints the tests that cost most:

    PYTHONPATH=tools .venv/bin/python -m pytest -p suite_profile      # writes suite_profile.tsv
    python tools/suite_profile.py suite_profile.tsv [--top 30]

Under ``-n 0`` add ``--machine`` to the summary: it ranks by the whole machine's busy CPU during
each test, which also counts what runs outside the test's tree (warm-server forks, orphans,
the kernel's work).

The CPU of a test is the growth of user+sys time over this process and every live descendant,
children that were waited for included (their time folds into their parent's). A process that
outlives its parent and is adopted by init (an orphaned build, say) is not counted. Each
pytest-xdist worker appends its own lines, tagged with its name.
"""
import argparse
import collections
import os
import time

OUT_ENV = "SUITE_PROFILE_OUT"
DEFAULT_OUT = "suite_profile.tsv"


def _tree_cpu(process):
    import psutil

    try:
        members = [process] + process.children(recursive=True)
    except psutil.Error:
        members = [process]
    total = 0.0
    for member in members:
        try:
            times = member.cpu_times()
        except psutil.Error:  # ended between listing and reading
            continue
        total += times.user + times.system + times.children_user + times.children_system
    return total


def machine_cpu():
    """Busy CPU seconds of the whole machine so far (``/proc/stat``: user, nice, system, irq,
    softirq). Under ``-n 0`` the growth over a test is everything that test caused, processes
    outside its tree (warm-server forks, orphans) and kernel work included, plus whatever else
    the machine ran meanwhile; with two xdist workers it counts both workers' tests."""
    try:
        with open("/proc/stat", encoding="ascii") as handle:
            fields = handle.readline().split()[1:]
    except OSError:
        return 0.0
    user, nice, system, _idle, _iowait, irq, softirq = (int(f) for f in fields[:7])
    return (user + nice + system + irq + softirq) / os.sysconf("SC_CLK_TCK")


try:
    import pytest
except ImportError:  # the summary needs no pytest
    pytest = None

if pytest is not None:
    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(item, nextitem):
        import psutil

        me = psutil.Process()
        cpu, wall, machine = _tree_cpu(me), time.monotonic(), machine_cpu()
        yield
        cpu, wall = _tree_cpu(me) - cpu, time.monotonic() - wall
        machine = machine_cpu() - machine
        worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
        with open(os.environ.get(OUT_ENV, DEFAULT_OUT), "a", encoding="utf-8") as handle:
            handle.write(f"{item.nodeid}\t{wall:.3f}\t{cpu:.3f}\t{worker}\t{machine:.3f}\n")


def summarize(path, top, machine=False):
    """Per file and per test, ranked by the tree's CPU, or with ``machine`` by the machine's
    (the fifth column, written by runs since it exists; meaningful under ``-n 0``)."""
    per_test = []
    per_file = collections.defaultdict(lambda: [0, 0.0, 0.0])
    with open(path, encoding="utf-8") as handle:
        for line in handle:
            fields = line.rstrip("\n").split("\t")
            nodeid, wall = fields[0], float(fields[1])
            cpu = float(fields[4] if machine and len(fields) > 4 else fields[2])
            per_test.append((cpu, wall, nodeid))
            entry = per_file[nodeid.split("::", 1)[0]]
            entry[0] += 1
            entry[1] += wall
            entry[2] += cpu
    kind = "machine CPU s" if machine else "CPU s"
    print(f"{len(per_test)} tests: {sum(t[1] for t in per_test):.0f} s wall (summed over "
          f"processes), {sum(t[0] for t in per_test):.0f} {kind}")
    print(f"\n{'CPU s':>8} {'wall s':>8} {'tests':>6}  file (top {top} by {kind})")
    for name, (count, wall, cpu) in sorted(per_file.items(), key=lambda kv: -kv[1][2])[:top]:
        print(f"{cpu:8.1f} {wall:8.1f} {count:6d}  {name}")
    print(f"\n{'CPU s':>8} {'wall s':>8}  test (top {top} by {kind})")
    for cpu, wall, nodeid in sorted(per_test, reverse=True)[:top]:
        print(f"{cpu:8.1f} {wall:8.1f}  {nodeid}")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("tsv", nargs="?", default=DEFAULT_OUT)
    parser.add_argument("--top", type=int, default=30)
    parser.add_argument("--machine", action="store_true",
                        help="rank by the machine's busy CPU during each test (runs with -n 0)")
    args = parser.parse_args(argv)
    summarize(args.tsv, args.top, args.machine)


if __name__ == "__main__":
    main()
