"""The tools upstream installs as commands are installed here under the same names, each a
console script of this distribution that runs the ``main`` the tools' own tests exercise
(tests/plugins/elasticity/test_ds_elastic_cli.py, tests/core/launcher/test_ds_ssh.py,
tests/core/comm/test_ds_bench.py, tests/plugins/zero/test_nvme_tools.py)."""
import os
import sys
from importlib import metadata

import pytest

TOOLS = {"ds_elastic": "deepspeed.elasticity.cli", "ds_ssh": "deepspeed.launcher.ds_ssh",
         "ds_bench": "deepspeed.comm.benchmark", "ds_io": "deepspeed.zero.nvme.ds_io",
         "ds_nvme_tune": "deepspeed.zero.nvme.sweep"}


@pytest.mark.parametrize("name", sorted(TOOLS))
def test_console_script_is_installed_and_runs_the_tested_main(name):
    scripts = {ep.name: ep for ep in metadata.distribution("deepspeed").entry_points
               if ep.group == "console_scripts"}
    assert name in scripts, f"{name} is not a console script of the installed distribution"
    entry = scripts[name]
    assert entry.value == f"{TOOLS[name]}:main"
    module = __import__(TOOLS[name], fromlist=["main"])
    assert entry.load() is module.main
    script = os.path.join(os.path.dirname(sys.executable), name)
    assert os.access(script, os.X_OK), f"{script} was not installed (reinstall: pip install -e .)"
