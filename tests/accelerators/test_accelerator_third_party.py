"""A pip-installed package adds an accelerator and an op builder through entry points alone."""
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from deepspeed.accelerator import installed_accelerators, installed_op_builders

PROBE = textwrap.dedent("""
    import inspect, json
    import torch
    from deepspeed.accelerator import get_accelerator, is_current_accelerator_supported
    acc = get_accelerator()
    acc.synchronize(); acc.synchronize()
    builder = acc.get_op_builder("ExampleOpBuilder")
    op = acc.create_op_builder("ExampleOpBuilder").load()
    print(json.dumps({
        "name": acc._name,
        "file": inspect.getfile(type(acc)),
        "supported": is_current_accelerator_supported(),
        "synchronize_calls": acc.synchronize_calls,
        "backend": acc.communication_backend_name(),
        "builder_file": inspect.getfile(builder),
        "builder_name": builder.NAME,
        "op_result": op.example_add(torch.ones(2), torch.ones(2)).tolist(),
    }))
""")


@pytest.fixture
def example_site(install_fixture_package):
    return Path(install_fixture_package("ds_example_accelerator"))


def test_entry_points_are_listed(example_site):
    assert installed_accelerators()["example"] == "ds_example_accelerator:ExampleAccelerator"
    assert installed_op_builders()["ExampleOpBuilder"] == "ds_example_accelerator:ExampleOpBuilder"
    assert installed_accelerators()["cpu"] == "deepspeed.accelerator.cpu_accelerator:CPU_Accelerator"


def test_ds_accelerator_selects_installed_package(example_site):
    env = dict(os.environ, DS_ACCELERATOR="example")
    done = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["name"] == "example"
    assert Path(report["file"]).resolve().is_relative_to(example_site.resolve())
    assert report["supported"] is True
    assert report["synchronize_calls"] == 2
    assert report["backend"] in ("gloo", "ccl")
    assert Path(report["builder_file"]).resolve().is_relative_to(example_site.resolve())
    assert report["builder_name"] == "example_op"
    assert report["op_result"] == [2.0, 2.0]
