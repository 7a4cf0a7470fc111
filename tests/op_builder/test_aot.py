"""DS_BUILD_* selection for ahead-of-time builds, and setup.py's torch-free default path."""
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from deepspeed.ops import op_builder
from deepspeed.ops.op_builder import OpBuilder
from deepspeed.ops.op_builder.aot import any_build_requested, select_ops

REPO = Path(__file__).resolve().parents[2]


class _Fake(OpBuilder):
    compatible = True

    def sources(self):
        return []

    def is_compatible(self, verbose=False):
        self.incompatible_reason = "" if self.compatible else f"{self.NAME} needs a GPU"
        return self.compatible


class FakeCPU(_Fake):
    NAME = "fake_cpu"


class FakeOther(_Fake):
    NAME = "fake_other"


class FakeGPU(_Fake):
    NAME = "fake_gpu"
    compatible = False


CLASSES = [FakeCPU, FakeOther, FakeGPU]


def _names(selected):
    return [b.NAME for b in selected]


def test_nothing_is_built_without_a_switch():
    assert not any_build_requested({"PATH": "/bin"})
    assert not any_build_requested({"DS_BUILD_OPS": "0"})
    assert select_ops(CLASSES, {}) == ([], [])


def test_build_all_takes_only_compatible_ops_and_reports_the_rest():
    assert any_build_requested({"DS_BUILD_OPS": "1"})
    selected, skipped = select_ops(CLASSES, {"DS_BUILD_OPS": "1"})
    assert _names(selected) == ["fake_cpu", "fake_other"]
    assert skipped == [("fake_gpu", "fake_gpu needs a GPU")]


def test_single_op_switches_and_exclusions():
    selected, skipped = select_ops(CLASSES, {"DS_BUILD_FAKE_OTHER": "1"})
    assert _names(selected) == ["fake_other"] and skipped == []
    selected, _ = select_ops(CLASSES, {"DS_BUILD_OPS": "1", "DS_BUILD_FAKE_CPU": "0"})
    assert _names(selected) == ["fake_other"]


def test_bad_switches_are_errors_naming_the_variable():
    with pytest.raises(ValueError, match="DS_BUILD_FAKE_CPUU.*known: DS_BUILD_OPS"):
        select_ops(CLASSES, {"DS_BUILD_FAKE_CPUU": "1"})
    with pytest.raises(ValueError, match="DS_BUILD_OPS='maybe'"):
        select_ops(CLASSES, {"DS_BUILD_OPS": "maybe"})


def test_every_builder_is_registered_by_entry_point():
    entry_points = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["entry-points"]
    registered = entry_points["deepspeed.op_builders"]
    expected = {name: f"deepspeed.ops.op_builder.{module}:{name}"
                for name, module in op_builder.BUILDER_MODULES.items()}
    assert registered == expected


def test_setup_py_does_not_import_torch_without_a_build_switch():
    env = {k: v for k, v in os.environ.items() if not k.startswith("DS_BUILD_")}
    script = ("import runpy, sys; sys.argv = ['setup.py', '--name']; "
              "runpy.run_path('setup.py', run_name='__main__'); "
              "print('torch imported:', 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", script], cwd=REPO, env=env, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "torch imported: False" in out.stdout
