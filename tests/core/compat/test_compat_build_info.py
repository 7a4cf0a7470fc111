"""``deepspeed.git_version_info`` and ``deepspeed.ops.__compatible_ops__`` as code written against
upstream reads them: honest values, computed from the checkout, the op builders and torch."""
import importlib
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch

import deepspeed
from deepspeed import git_version_info
from deepspeed.accelerator import get_accelerator, installed_op_builders
from deepspeed.utils import build_info

REPO = Path(__file__).resolve().parents[3]


def test_version_is_the_package_version():
    assert git_version_info.version == deepspeed.__version__


def test_git_info_is_the_checkout_an_editable_install_runs_from():
    if not (REPO / ".git").exists():
        pytest.skip("not running from a git checkout")
    ask = lambda *a: subprocess.run(["git", "-C", str(REPO), "rev-parse", *a],  # noqa: E731
                                    capture_output=True, text=True, check=True).stdout.strip()
    assert (git_version_info.git_hash, git_version_info.git_branch) == \
        (ask("--short", "HEAD"), ask("--abbrev-ref", "HEAD"))


def test_no_checkout_is_unknown_never_invented(tmp_path):
    assert build_info.checkout_info(str(tmp_path)) == ("unknown", "unknown")


def test_a_built_package_reads_the_record_written_at_build_time(tmp_path, monkeypatch):
    """setup.py's build_py writes the record (build_info.write_installed_module); once present
    it wins over any checkout."""
    path = tmp_path / "record.py"
    written = build_info.write_installed_module(str(path), str(REPO))
    namespace = {}
    exec(path.read_text(), namespace)
    assert (namespace["git_hash"], namespace["git_branch"]) == written
    record = types.ModuleType("deepspeed.git_version_info_installed")
    record.git_hash, record.git_branch = "abc1234", "release"
    monkeypatch.setitem(sys.modules, record.__name__, record)
    assert git_version_info.git_info() == ("abc1234", "release")


def _builders():
    found = {}
    for class_name in installed_op_builders():
        builder = get_accelerator().create_op_builder(class_name)
        if builder is not None:
            found[builder.NAME] = builder
    return found


def test_op_tables_are_the_builders_own_answers():
    builders = _builders()
    assert set(git_version_info.compatible_ops) == set(builders) == \
        set(git_version_info.installed_ops)
    for name, builder in builders.items():
        assert git_version_info.compatible_ops[name] == builder.is_compatible(verbose=False)
        assert git_version_info.installed_ops[name] == builder.is_installed()
    assert deepspeed.ops.__compatible_ops__ is git_version_info.compatible_ops
    from deepspeed.ops import __compatible_ops__

    assert __compatible_ops__ == git_version_info.compatible_ops


def test_compatibility_follows_the_machine(monkeypatch):
    """Without a C++ compiler the C++ ops are not compatible: the table is computed, not fixed."""
    monkeypatch.setenv("CXX", "/nonexistent/c++")
    _, compatible = git_version_info.op_status()
    assert compatible["cpu_adam"] is False


def test_torch_info_describes_the_running_torch():
    info = git_version_info.torch_info
    assert set(info) == {"version", "bf16_support", "cuda_version", "nccl_version", "hip_version"}
    assert info["version"] == ".".join(torch.__version__.split(".")[:2])
    assert info["bf16_support"] == get_accelerator().is_bf16_supported()
    assert info["cuda_version"] == (".".join(torch.version.cuda.split(".")[:2])
                                    if torch.version.cuda else "0.0")
    if not torch.cuda.is_available():
        assert info["nccl_version"] == "0.0"
    assert importlib.import_module("deepspeed.git_version_info") is git_version_info
