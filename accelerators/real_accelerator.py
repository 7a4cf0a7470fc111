"""Which accelerator this process uses, chosen once and cached.

Order: the `DS_ACCELERATOR` environment variable (so a launcher or user can force a device without
touching code), else an instance given to `set_accelerator()`, else detection (CUDA when torch sees
a GPU, otherwise CPU). Every name is resolved through the `deepspeed.accelerators` entry points.

Detection asks torch only when the machine might have a GPU: with no GPU device file and no GPU
tool on PATH torch cannot see one either, and the `deepspeed` launcher (which only counts
devices) then never imports torch, seconds of CPU saved on every launch.
"""
from __future__ import annotations

import glob
import os
import shutil
import threading

from deepspeed.accelerator import registry
from deepspeed.accelerator.abstract_accelerator import DeepSpeedAccelerator
from deepspeed.utils.logging import logger

ENV_VAR = "DS_ACCELERATOR"
#: what a GPU torch could use leaves behind: NVIDIA and AMD (ROCm) device nodes, WSL's GPU node
GPU_DEVICE_FILES = ("/dev/nvidia[0-9]*", "/dev/nvidiactl", "/dev/kfd", "/dev/dxg")
GPU_TOOLS = ("nvidia-smi", "rocm-smi")

_lock = threading.RLock()
_active = None  # the cached choice
_user_choice = None  # the instance given to set_accelerator()


def load_accelerator_class(name, source="accelerator"):
    """The accelerator class registered as `name`; `source` names where the name came from."""
    available = registry.accelerator_entry_points()
    entry_point = available.get(name)
    if entry_point is None:
        matches = [ep for key, ep in available.items() if key.lower() == name.lower()]
        entry_point = matches[0] if len(matches) == 1 else None
    if entry_point is None:
        installed = ", ".join(available) or "none"
        raise ValueError(f"{source}={name!r} is not an installed accelerator; installed accelerators "
                         f"(entry-point group '{registry.ACCELERATOR_GROUP}'): {installed}")
    try:
        accelerator_class = entry_point.load()
    except Exception as err:
        raise ImportError(f"accelerator {entry_point.name!r} could not be loaded from "
                          f"{entry_point.value!r}: {err}") from err
    if not (isinstance(accelerator_class, type) and issubclass(accelerator_class, DeepSpeedAccelerator)):
        raise TypeError(f"entry point {entry_point.name!r} = {entry_point.value!r} in group "
                        f"'{registry.ACCELERATOR_GROUP}' is {accelerator_class!r}, "
                        "not a DeepSpeedAccelerator subclass")
    return accelerator_class


def _from_env(name):
    if _user_choice is not None and (_user_choice._name or "").lower() == name.lower():
        return _user_choice
    accelerator_class = load_accelerator_class(name, source=ENV_VAR)
    if _user_choice is not None:
        logger.warning(f"{ENV_VAR}={name!r} overrides the accelerator given to set_accelerator() "
                       f"({_user_choice._name!r})")
    return accelerator_class()


def might_have_gpu():
    """False only when no GPU device file exists and no GPU tool is on PATH: then torch would
    report no CUDA device, and asking it would cost a torch import."""
    return (any(glob.glob(pattern) for pattern in GPU_DEVICE_FILES)
            or any(shutil.which(tool) for tool in GPU_TOOLS))


def detect_accelerator_name():
    """'cuda' when torch sees a GPU, else 'cpu'; torch is imported only if a GPU might exist."""
    if not might_have_gpu():
        return "cpu"
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def _select():
    name = os.environ.get(ENV_VAR, "").strip()
    if name:
        accelerator, how = _from_env(name), f"{ENV_VAR}={name}"
    elif _user_choice is not None:
        accelerator, how = _user_choice, "set_accelerator"
    else:
        name = detect_accelerator_name()
        accelerator, how = load_accelerator_class(name, source="detected")(), "auto detect"
    logger.debug(f"Setting ds_accelerator to {accelerator._name} ({how})")
    return accelerator


def get_accelerator() -> DeepSpeedAccelerator:
    """The accelerator of this process (selected on first call, then cached)."""
    global _active
    with _lock:
        if _active is None:
            _active = _select()
        return _active


def set_accelerator(accelerator: DeepSpeedAccelerator) -> None:
    """Use `accelerator` from now on, unless `DS_ACCELERATOR` names a different one."""
    global _active, _user_choice
    if not isinstance(accelerator, DeepSpeedAccelerator):
        raise TypeError(f"set_accelerator() needs a DeepSpeedAccelerator instance, got {accelerator!r}")
    with _lock:
        _user_choice = accelerator
        _active = None


def is_current_accelerator_supported() -> bool:
    """Whether the active accelerator is one registered through the entry points."""
    return get_accelerator()._name in registry.installed_accelerators()


def reset_accelerator() -> None:
    """Forget the cached and the user-set accelerator; tests call it between cases."""
    global _active, _user_choice
    with _lock:
        _active = None
        _user_choice = None
