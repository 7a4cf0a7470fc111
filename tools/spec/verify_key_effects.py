"""Check that each "implemented" row of the key-effect table names a test that fails without
the key: run the test once with the key's value forced back to its default after validation
(as if the implementation never read it), and report the rows whose test still passes.

    python tools/spec/verify_key_effects.py [KEY_PREFIX ...] [--baseline]

The suite itself only checks that the named test exists and names the key
(tests/docs/test_key_effects.py); whether it *depends* on the key needs a run per key, which
is too slow for the suite (one pytest process per key). The mutation: a `sitecustomize` put on
PYTHONPATH of the pytest process (and so of the `dist_pool` workers it starts) wraps
`deepspeed.config.model.refused_keys`, which every section model calls when it validates, so
that it first resets the key's field to its default on the model that owns it.

Tests run in rounds, one pytest process per round with each named test at most once (a small
pytest plugin sets the mutation of the test about to run in a file the wrapper reads), so a
test named by several keys runs once per key but the start-up cost is paid per round.

Results (one line per key): `ok` the test failed under the mutation, `PASSES` it did not (the
row names the wrong test, or the key has no effect), `SKIPPED` it skipped (hardware it needs),
`NOT RUN` / `MISSING` it could not be run. With --baseline the named tests first run
unchanged; a test that fails anyway is reported as `BROKEN` instead of `ok`. Rows of
plain-value plugin sections (not models) are skipped.
"""
import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools" / "docs"))

import gen_config_reference as ref  # noqa: E402

SITECUSTOMIZE = '''\
import os

_FILE = os.environ["KEY_EFFECT_MUTATION_FILE"]


def _mutation():
    try:
        with open(_FILE) as handle:
            text = handle.read().strip()
    except OSError:
        return None
    return text.split(":") if text else None


def _install():
    import deepspeed.config.model as where

    original = where.refused_keys

    def refused_keys(model):
        mutation = _mutation()
        if mutation is not None:
            module, qualname, field = mutation
            cls = type(model)
            if any(c.__module__ == module and c.__qualname__ == qualname for c in cls.__mro__):
                info = cls.model_fields[field]
                model.__dict__[field] = info.get_default(call_default_factory=True)
        return original(model)

    where.refused_keys = refused_keys


try:
    _install()
except ImportError:  # a process that never imports deepspeed
    pass
'''

PLUGIN = '''\
"""Sets the mutation of each test before it runs and records which tests failed."""
import json
import os

import pytest

_PLAN = json.loads(open(os.environ["KEY_EFFECT_PLAN"]).read())
_OUTCOMES = {}  # test id -> set of outcomes of its items ("passed", "failed", "skipped")


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    with open(os.environ["KEY_EFFECT_MUTATION_FILE"], "w") as handle:
        handle.write(_PLAN.get(item.nodeid.split("[")[0], ""))


def pytest_runtest_logreport(report):
    if report.when == "call" or report.outcome != "passed":
        _OUTCOMES.setdefault(report.nodeid.split("[")[0], set()).add(report.outcome)


def pytest_sessionfinish(session):
    with open(os.environ["KEY_EFFECT_RESULT"], "w") as handle:
        json.dump({test: sorted(outcomes) for test, outcomes in _OUTCOMES.items()}, handle)
'''


def owners():
    """{full key path: (module, class qualname, field name)} for every model field."""
    found = {}

    def walk(model, prefix, by_name):
        for name, info in model.model_fields.items():
            key = name if by_name else (info.alias or name)
            full = prefix + key
            found[full] = (model.__module__, model.__qualname__, name)
            for sub in ref.nested_models(info.annotation):
                walk(sub, full + ".", by_name)
            for item in ref.dict_item_models(info.annotation):
                walk(item, full + ".<name>.", by_name)

    for key, model, _owner in ref.all_sections():
        if ref._is_model(model):
            walk(model, f"{key}." if key else "", key == ref.INFERENCE_KEY)
    return found


def run_round(plan, workdir, name):
    """Run every test of `plan` ({test id: mutation text, "" for none}) in one pytest
    process; returns {test id: the outcomes of its items} for the tests that ran."""
    import json

    plan_file = Path(workdir, f"{name}.plan.json")
    result_file = Path(workdir, f"{name}.result.json")
    plan_file.write_text(json.dumps(plan), encoding="utf-8")
    env = dict(os.environ)
    env.setdefault("TORCH_EXTENSIONS_DIR", str(ROOT / ".torch_ext"))
    env.update(KEY_EFFECT_MUTATION_FILE=str(Path(workdir, "mutation")),
               KEY_EFFECT_PLAN=str(plan_file), KEY_EFFECT_RESULT=str(result_file),
               PYTHONPATH=os.pathsep.join(filter(None, [workdir, env.get("PYTHONPATH")])))
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p",
               "no:xdist", "-o", "addopts=", "-p", "key_effect_plugin", *sorted(plan)]
    subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
    if not result_file.is_file():
        raise RuntimeError(f"round {name}: pytest wrote no result (collection error?)")
    return {test: set(outcomes)
            for test, outcomes in json.loads(result_file.read_text(encoding="utf-8")).items()}


def verdict(outcomes, broken):
    """What one mutated run says about a row."""
    if broken:
        return "BROKEN (fails unchanged)"
    if not outcomes:
        return "NOT RUN"
    if "failed" in outcomes:
        return "ok"
    return "PASSES" if "passed" in outcomes else "SKIPPED"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("prefixes", nargs="*", help="only keys starting with one of these")
    parser.add_argument("--baseline", action="store_true")
    args = parser.parse_args(argv)
    where = owners()
    rows = [(full, row.effect.detail) for full, row in ref.key_effects()
            if row.effect is not None and row.effect.kind == ref.IMPLEMENTED
            and (not args.prefixes or full.startswith(tuple(args.prefixes)))]
    workdir = tempfile.mkdtemp(prefix="key_effects_")
    Path(workdir, "sitecustomize.py").write_text(SITECUSTOMIZE, encoding="utf-8")
    Path(workdir, "key_effect_plugin.py").write_text(PLUGIN, encoding="utf-8")
    broken = set()
    if args.baseline:
        baseline = run_round({test: "" for _, test in rows}, workdir, "baseline")
        broken = {test for test, outcomes in baseline.items() if "failed" in outcomes}
    # rounds: each test at most once per pytest run, with the mutation of one of its keys
    exists = {test for _, test in rows if (ROOT / test.split("::")[0]).is_file()}
    pending = [(full, test) for full, test in rows if full in where and test in exists]
    verdicts = {full: "SKIP (plain section)" for full, _ in rows if full not in where}
    verdicts.update({full: "MISSING (no such file)" for full, test in rows
                     if full in where and test not in exists})
    for full, verdict_text in verdicts.items():
        print(f"{verdict_text:24} {full}", flush=True)
    round_number = 0
    while pending:
        plan, this_round, later = {}, [], []
        for full, test in pending:
            if test in plan:
                later.append((full, test))
            else:
                plan[test] = ":".join(where[full])
                this_round.append((full, test))
        outcomes = run_round(plan, workdir, f"round{round_number}")
        for full, test in this_round:
            verdicts[full] = verdict(outcomes.get(test, set()), test in broken)
            print(f"{verdicts[full]:24} {full}  ->  {test}", flush=True)
        pending, round_number = later, round_number + 1
    return 1 if any(v != "ok" for v in verdicts.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
