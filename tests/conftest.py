"""Shared test fixtures.

`install_fixture_package` pip-installs one of the third-party example packages under
`tests/fixtures/` into a private target directory, exactly as a user's `pip install` would, and
puts that directory on `sys.path` (and on PYTHONPATH for subprocesses). Discovery then goes
purely through the installed distribution's entry points: nothing is registered by hand.
"""
import gc
import importlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

# Cache bytecode even where the shell sets PYTHONDONTWRITEBYTECODE (this machine's does): the
# test command installs with `pip install --no-compile`, so the modules the suite imports are
# compiled on first import, once, and only those. Set before the plugin below imports torch,
# and inherited by the warm Python server, the xdist workers and every program they start
# (whose variables then match the server's). Without the cache every xdist worker also
# re-rewrote the asserts of all test modules (~7 of its ~23 CPU s of collection).
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
sys.dont_write_bytecode = False

# the `dist_pool` fixture: warm gloo worker pools shared by every multi-rank test
pytest_plugins = ["deepspeed.testing.pytest_plugin"]

from deepspeed.testing import distributed, warm_python  # noqa: E402  (after the bytecode switch)

# The Hugging Face models the suite's rank functions and Trainer scripts build: imported once by
# the rank pools' forkserver and the warm Python server's "hf" flavour instead of by every rank
# and program (~3 CPU s each: the models package scans every model's source for its exports).
# Set here, before the plugin starts the warm server and before any pool starts.
SUITE_HF_MODELS = ("transformers.models.gpt2.modeling_gpt2", "transformers.models.llama.modeling_llama",
                   "transformers.models.bert.modeling_bert", "transformers.models.t5.modeling_t5")
warm_python.HF_PRELOAD = (*warm_python.HF_PRELOAD, *SUITE_HF_MODELS)
distributed.PRELOAD.extend(SUITE_HF_MODELS)


# pytest-xdist (`-n 2 --dist loadfile`, set in pyproject.toml) hands each process whole test
# files, so module fixtures (a Trainer run read by several tests) run once. These files start
# jobs of several processes (launcher and Trainer runs) and take longest, longest first: they are
# handed out first so that none is left running alone at the end. Only the order depends on this
# list; a run without xdist (`-n 0`) keeps the usual order.
# (Order re-read from the 2026-11-28 whole-suite profile, after the multi-node files stopped
# waiting on DNS: docs/dev/test-suite-speed.md, third pass.)
RUN_FIRST_UNDER_XDIST = [
    "tests/core/launcher/test_multinode_launch_e2e.py",
    "tests/plugins/zero/test_zeropp_training.py",
    "tests/e2e/test_hf_trainer.py",
    "tests/e2e/test_cli.py",
    "tests/plugins/elasticity/test_elastic_launch.py",
    "tests/plugins/autotuning/test_autotuning_launch.py",
    "tests/e2e/test_gpu_check_dry_run.py",
    "tests/plugins/plan/test_plan_vs_measured.py",
    "tests/plugins/zero/test_zeropp_compose.py",
    "tests/docs/test_tutorials.py",
    "tests/plugins/zero/test_zero_mics.py",
    "tests/plugins/tensor_parallel/test_tp_hf_trainer.py",
    "tests/core/launcher/test_multinode_selection_e2e.py",
    "tests/e2e/test_hf_accelerate.py",
    "tests/plugins/moe/test_moe_checkpoint.py",
    "tests/plugins/zero/test_zeropp_example.py",
    "tests/e2e/test_examples.py",
    "tests/plugins/pipe/test_pipe_checkpoint.py",
    "tests/plugins/sparse_attention/test_triton_kernels.py",
    "tests/core/ops/test_evoformer_attention.py",
    "tests/plugins/zero/test_zero_stage3.py",
    "tests/core/launcher/test_launch_e2e.py",
    "tests/plugins/moe/test_moe_tensor_parallel.py",
    "tests/plugins/moe/test_moe_universal.py",
    "tests/plugins/sequence/test_sequence_long_context.py",
    "tests/e2e/test_hf_zero3_save_and_inference.py",
    "tests/plugins/inference/test_inference_autotp.py",
    "tests/plugins/sequence/test_sequence_hf_trainer.py",
]


def pytest_collection_modifyitems(config, items):
    if not hasattr(config, "workerinput"):  # not an xdist worker
        return
    position = {path: i for i, path in enumerate(RUN_FIRST_UNDER_XDIST)}
    items.sort(key=lambda item: position.get(item.nodeid.split("::", 1)[0], len(position)))


def pytest_collection_finish(session):
    """What collection imported (torch, deepspeed, every test module) lives for the whole run:
    frozen, it is no longer walked by each full garbage collection (0.1-0.5 s apiece with that
    heap, ~10% of a worker's CPU). Objects the tests create are collected as before."""
    gc.collect()
    gc.freeze()


def pytest_unconfigure(config):
    # thawed for the interpreter's last collection: objects still frozen at exit are never
    # freed, and extensions that count their instances (triton's nanobind) report them leaked
    gc.unfreeze()


FIXTURES = Path(__file__).parent / "fixtures"


@pytest.fixture(scope="session")
def _fixture_package_sites(tmp_path_factory):
    """{fixture package name: the directory it was pip-installed into}, built once per session."""
    sites = {}

    def site_of(name):
        if name not in sites:
            source = FIXTURES / name
            if not (source / "pyproject.toml").is_file():
                raise FileNotFoundError(f"no fixture package at {source}")
            target = tmp_path_factory.mktemp(f"site-{name}")
            subprocess.run(
                [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps",
                 "--no-build-isolation", "--target", str(target), str(source)],
                check=True,
            )
            sites[name] = target
        return sites[name]

    return site_of


@pytest.fixture
def install_fixture_package(_fixture_package_sites, monkeypatch):
    """Make a fixture package importable and its entry points visible for one test only.

    Installed for the whole session, a third-party op builder or plugin would show up in every
    later test on the same worker (ds_report rows, the plugin list), so what a test sees would
    depend on which tests ran before it. The install itself is cached; the visibility is not."""
    added = []

    def install(name):
        target = _fixture_package_sites(name)
        if str(target) not in sys.path:
            monkeypatch.syspath_prepend(str(target))  # also invalidates import caches
            monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
                p for p in (str(target), os.environ.get("PYTHONPATH", "")) if p))
            added.append(name)
        return target

    yield install
    for name in added:
        for module in [m for m in sys.modules if m == name or m.startswith(name + ".")]:
            del sys.modules[module]
    importlib.invalidate_caches()


@pytest.fixture(autouse=True)
def no_process_group_left_behind(request):
    """A test that brings up torch.distributed in the pytest process itself (an in-process
    ``deepspeed.initialize``) must tear it down: a group left behind changes what later tests
    see (a world of 1 where they expect none) and holds the default port. The group is
    destroyed so the rest of the run is unaffected, and the test that left it fails."""
    yield
    import torch.distributed as tdist

    if tdist.is_available() and tdist.is_initialized():
        from deepspeed import comm as dist

        dist.destroy_process_group()
        pytest.fail(f"{request.node.nodeid} left a torch.distributed process group initialised "
                    f"in the pytest process; run it in a worker (dist_pool / run_distributed) "
                    f"or destroy the group", pytrace=False)
