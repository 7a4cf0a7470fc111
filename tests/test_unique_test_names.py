"""Test modules are imported by basename (rootdir-relative, no packages under tests/), so two
plugin suites with a `test_engine.py` each break collection of the whole suite. Say which."""
from collections import defaultdict
from pathlib import Path

TESTS = Path(__file__).parent


def test_every_test_module_basename_is_unique():
    seen = defaultdict(list)
    for path in TESTS.rglob("*.py"):
        if path.name not in ("conftest.py", "__init__.py") and "fixtures" not in path.parts:
            seen[path.name].append(str(path.relative_to(TESTS)))
    clashes = {name: paths for name, paths in seen.items() if len(paths) > 1}
    assert not clashes, f"rename so each basename is unique (e.g. prefix the plugin): {clashes}"
