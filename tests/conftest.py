"""Shared test fixtures.

`install_fixture_package` pip-installs one of the third-party example packages under
`tests/fixtures/` into a private target directory, exactly as a user's `pip install` would, and
puts that directory on `sys.path` (and on PYTHONPATH for subprocesses). Discovery then goes
purely through the installed distribution's entry points: nothing is registered by hand.
"""
import importlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

# the `dist_pool` fixture: warm gloo worker pools shared by every multi-rank test
pytest_plugins = ["deepspeed.testing.pytest_plugin"]


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """How pytest-xdist (`-n`, set in pyproject.toml) shares the suite among its processes: a test
    file is one unit (so module fixtures, such as a Trainer run several tests read, run once), and
    files marked `xdist_group(NAME)` form one unit (tests sharing a session fixture that must not
    exist twice, such as the launcher's fake cluster of network namespaces)."""
    from xdist.scheduler import LoadGroupScheduling

    class FileOrGroupScheduling(LoadGroupScheduling):
        def _split_scope(self, nodeid):
            group = super()._split_scope(nodeid)  # the group name, else the whole node id
            return group if group != nodeid else nodeid.split("::", 1)[0]

    return FileOrGroupScheduling(config, log)

FIXTURES = Path(__file__).parent / "fixtures"


@pytest.fixture(scope="session")
def install_fixture_package(tmp_path_factory):
    installed = {}

    def install(name):
        if name in installed:
            return installed[name]
        source = FIXTURES / name
        if not (source / "pyproject.toml").is_file():
            raise FileNotFoundError(f"no fixture package at {source}")
        target = tmp_path_factory.mktemp(f"site-{name}")
        subprocess.run(
            [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
             "--target", str(target), str(source)],
            check=True,
        )
        sys.path.insert(0, str(target))
        os.environ["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(target), os.environ.get("PYTHONPATH", "")) if p)
        importlib.invalidate_caches()
        installed[name] = target
        return target

    yield install
    for target in installed.values():
        if str(target) in sys.path:
            sys.path.remove(str(target))


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
