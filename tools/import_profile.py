"""Where a test run's Python processes spend their samples, and how much of it is importing.

Reads the "raw" (collapsed stacks) output of ``py-spy record -s -f raw`` over the whole suite:

    pip install py-spy   # into any environment; it attaches to the suite's processes
    py-spy record -s -r 20 -f raw -o spy.txt --nonblocking -- .venv/bin/python -m pytest -q
    python tools/import_profile.py spy.txt

and prints the samples per kind of process (rank pools, warm-server programs, others), the
share of each kind spent importing, and the packages whose imports cost most, per kind: what a
preload (``deepspeed.testing.distributed.PRELOAD``, ``deepspeed.testing.warm_python``'s
``WATCHED_PRELOAD`` / ``HF_PRELOAD``) would save. Samples are not CPU seconds (py-spy counts
some waiting threads as active): read shares, and compare runs with each other.
"""
import argparse
import collections
import re
from pathlib import Path

IMPORT_FRAMES = ("_find_and_load (", "_LazyModule._get_module (")
MODULE_FRAME = re.compile(r"<module> \(([^:)]*)")
# folders of this repository: imports of them are the code under test, not a preload candidate
# (py-spy names a plugin's files from their own folder: "autotuning/plugin.py")
ROOT = Path(__file__).resolve().parents[1]
OWN = ("core", "plugins", "accelerators", "op_builder", "tests", "examples", "tools")


def is_own(package):
    top = package.split("/")[0]
    return top in OWN or (ROOT / "plugins" / top).is_dir() or (ROOT / "core" / top).is_dir()


def read_stacks(path):
    """(frames, samples) per line of a py-spy raw file."""
    with open(path, encoding="utf-8", errors="replace") as handle:
        for line in handle:
            stack, _, count = line.rstrip("\n").rpartition(" ")
            if count.isdigit() and stack:
                yield stack.split(";"), int(count)


def process_kind(frames):
    """'pool' (a rank forked by the forkserver), 'warm' (a program forked by a warm server), or
    the innermost process's program name."""
    processes = [f for f in frames if f.startswith("process ")]
    label = processes[-1] if processes else ""
    if "multiprocessing.forkserver" in label:
        return "pool"
    if "warm_python.py" in label:
        return "warm"
    match = re.search(r'"(\S+)', label)
    return match.group(1).rsplit("/", 1)[-1] if match else "?"


def imported_package(frames):
    """The package (top folder, or torch/transformers subpackage) of the outermost module being
    imported in this stack, None when the stack is not importing."""
    for i, frame in enumerate(frames):
        if frame.startswith(IMPORT_FRAMES):
            for inner in frames[i:]:
                match = MODULE_FRAME.match(inner)
                if match:
                    parts = match.group(1).split("/")
                    if parts[0] in ("torch", "transformers") and len(parts) > 2:
                        return "/".join(parts[:2])
                    return parts[0] if len(parts) > 1 else parts[0].removesuffix(".py")
            return "?"
    return None


def summarize(stacks):
    kinds, importing, packages = collections.Counter(), collections.Counter(), collections.Counter()
    for frames, count in stacks:
        kind = process_kind(frames)
        kinds[kind] += count
        package = imported_package(frames)
        if package is not None:
            importing[kind] += count
            packages[(kind, package)] += count
    return kinds, importing, packages


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("raw", help="py-spy record -f raw output")
    parser.add_argument("--top", type=int, default=25, help="packages to list (default 25)")
    args = parser.parse_args(argv)
    kinds, importing, packages = summarize(read_stacks(args.raw))
    total = sum(kinds.values()) or 1
    print(f"{'process kind':<24}{'samples':>9}{'share':>8}{'importing':>11}")
    for kind, count in kinds.most_common():
        print(f"{kind:<24}{count:>9}{100 * count / total:>7.1f}%{100 * importing[kind] / count:>10.1f}%")
    print(f"all importing: {100 * sum(importing.values()) / total:.1f}% of {total} samples\n")
    print(f"{'kind':<10}{'package imported':<34}{'samples':>9}{'share':>8}  (this repository's own "
          "folders marked *)")
    for (kind, package), count in packages.most_common(args.top):
        mark = "*" if is_own(package) else " "
        print(f"{kind:<10}{package:<33}{mark}{count:>9}{100 * count / total:>7.1f}%")


if __name__ == "__main__":
    main()
