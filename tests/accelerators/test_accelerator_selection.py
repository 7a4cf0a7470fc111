"""Choosing the accelerator: DS_ACCELERATOR, set_accelerator, detection, and op builder lookup."""
import sys
import types

import pytest
import torch

import deepspeed
from deepspeed.accelerator import (DeepSpeedAccelerator, get_accelerator, installed_accelerators,
                                   is_current_accelerator_supported, reset_accelerator, set_accelerator)
from deepspeed.accelerator.cpu_accelerator import CPU_Accelerator
from deepspeed.accelerator.cuda_accelerator import CUDA_Accelerator


class CustomAccelerator(CPU_Accelerator):

    def __init__(self, name="custom"):
        super().__init__()
        self._name = name


def test_builtins_are_registered_by_entry_point():
    installed = installed_accelerators()
    assert installed["cpu"] == "deepspeed.accelerator.cpu_accelerator:CPU_Accelerator"
    assert installed["cuda"] == "deepspeed.accelerator.cuda_accelerator:CUDA_Accelerator"


def test_detection_follows_torch_cuda():
    expected = CUDA_Accelerator if torch.cuda.is_available() else CPU_Accelerator
    assert type(get_accelerator()) is expected
    assert is_current_accelerator_supported()
    assert deepspeed.get_accelerator() is get_accelerator()


def test_detection_asks_torch_only_where_a_gpu_might_exist(monkeypatch):
    """No GPU device file and no GPU tool: 'cpu' without asking torch (the launcher then never
    imports it); either one present: torch decides."""
    from deepspeed.accelerator import real_accelerator

    asked = []

    def is_available():
        asked.append(True)
        return True

    monkeypatch.setattr(torch.cuda, "is_available", is_available)
    monkeypatch.setattr(real_accelerator.glob, "glob", lambda pattern: [])
    monkeypatch.setattr(real_accelerator.shutil, "which", lambda tool: None)
    assert real_accelerator.detect_accelerator_name() == "cpu" and asked == []

    monkeypatch.setattr(real_accelerator.glob, "glob",
                        lambda pattern: ["/dev/nvidia0"] if pattern.startswith("/dev/nvidia[") else [])
    assert real_accelerator.detect_accelerator_name() == "cuda" and asked == [True]

    monkeypatch.setattr(real_accelerator.glob, "glob", lambda pattern: [])
    monkeypatch.setattr(real_accelerator.shutil, "which",
                        lambda tool: "/usr/bin/nvidia-smi" if tool == "nvidia-smi" else None)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert real_accelerator.detect_accelerator_name() == "cpu"  # a tool without a usable GPU


def test_choice_is_cached_until_reset():
    first = get_accelerator()
    assert get_accelerator() is first
    reset_accelerator()
    assert get_accelerator() is not first


def test_ds_accelerator_cpu_is_honoured(monkeypatch):
    monkeypatch.setenv("DS_ACCELERATOR", "cpu")
    assert type(get_accelerator()) is CPU_Accelerator


def test_ds_accelerator_cuda_can_be_forced_without_gpu(monkeypatch):
    monkeypatch.setenv("DS_ACCELERATOR", "cuda")
    accelerator = get_accelerator()
    assert type(accelerator) is CUDA_Accelerator
    assert accelerator.communication_backend_name() == "nccl"


def test_unknown_ds_accelerator_names_installed_ones(monkeypatch):
    monkeypatch.setenv("DS_ACCELERATOR", "warp_drive")
    with pytest.raises(ValueError) as err:
        get_accelerator()
    message = str(err.value)
    assert "DS_ACCELERATOR='warp_drive'" in message
    assert "cpu" in message and "cuda" in message


def test_set_accelerator_is_honoured():
    custom = CustomAccelerator()
    set_accelerator(custom)
    assert get_accelerator() is custom
    assert not is_current_accelerator_supported()  # not registered by any entry point


def test_set_accelerator_replaces_cached_choice():
    get_accelerator()
    custom = CustomAccelerator()
    set_accelerator(custom)
    assert get_accelerator() is custom


def test_set_accelerator_rejects_non_accelerators():
    with pytest.raises(TypeError, match="DeepSpeedAccelerator"):
        set_accelerator("cpu")


def test_env_wins_over_set_accelerator_unless_same_name(monkeypatch):
    monkeypatch.setenv("DS_ACCELERATOR", "cpu")
    set_accelerator(CustomAccelerator("custom"))
    assert type(get_accelerator()) is CPU_Accelerator
    same_name = CustomAccelerator("cpu")
    set_accelerator(same_name)
    assert get_accelerator() is same_name


def test_abstract_class_cannot_be_instantiated_half_done():

    class Incomplete(DeepSpeedAccelerator):
        _name = "incomplete"

    with pytest.raises(TypeError, match="abstract"):
        Incomplete()


# ------------------------------------------------------------------ op builders
def test_unknown_op_builder_is_none():
    assert get_accelerator().get_op_builder("NoSuchBuilder") is None
    assert get_accelerator().create_op_builder("NoSuchBuilder") is None


def test_op_builder_name_must_be_identifier():
    with pytest.raises(ValueError, match="identifier"):
        get_accelerator().get_op_builder("not a name")


class _DirAccelerator(CPU_Accelerator):

    def __init__(self, module):
        super().__init__()
        self._module = module

    def op_builder_dir(self):
        return self._module


def test_op_builder_dir_override(monkeypatch):
    module = types.ModuleType("vendor_builders_for_test")

    class VendorBuilder:
        NAME = "vendor"

    module.VendorBuilder = VendorBuilder
    module.not_a_class = 3
    monkeypatch.setitem(sys.modules, module.__name__, module)
    accelerator = _DirAccelerator(module.__name__)
    assert accelerator.get_op_builder("VendorBuilder") is VendorBuilder
    assert isinstance(accelerator.create_op_builder("VendorBuilder"), VendorBuilder)
    assert accelerator.get_op_builder("not_a_class") is None


def test_missing_op_builder_module_is_none():
    assert _DirAccelerator("no_such_vendor.builders").get_op_builder("X") is None


def test_broken_op_builder_module_raises(tmp_path, monkeypatch):
    (tmp_path / "broken_vendor_builders.py").write_text("import no_such_dependency_xyz\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ModuleNotFoundError, match="no_such_dependency_xyz"):
        _DirAccelerator("broken_vendor_builders").get_op_builder("X")


def test_third_party_entry_point_overrides_builtin_of_same_name(monkeypatch):
    from deepspeed.accelerator import registry

    def ep(name, value, dist):
        return types.SimpleNamespace(name=name, value=value, dist=types.SimpleNamespace(metadata={"Name": dist}))

    found = [ep("cpu", "vendor:Cpu", "vendor-pkg"), ep("cpu", "deepspeed.accelerator.cpu_accelerator:CPU_Accelerator",
                                                      "deepspeed"), ep("cuda", "deepspeed:Cuda", "deepspeed")]

    class Found(list):

        def select(self, group):
            return self if group == registry.ACCELERATOR_GROUP else []

    monkeypatch.setattr(registry.importlib.metadata, "entry_points", lambda: Found(found))
    assert registry.installed_accelerators() == {"cpu": "vendor:Cpu", "cuda": "deepspeed:Cuda"}
    found.reverse()
    assert registry.installed_accelerators() == {"cpu": "vendor:Cpu", "cuda": "deepspeed:Cuda"}
    assert registry.installed_op_builders() == {}
