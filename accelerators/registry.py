"""Entry-point discovery of accelerators and op builders (see `deepspeed.utils.entry_points`:
a third-party registration of a built-in name replaces the built-in)."""
from __future__ import annotations

import importlib

from deepspeed.utils.entry_points import entry_points_of

ACCELERATOR_GROUP = "deepspeed.accelerators"
OP_BUILDER_GROUP = "deepspeed.op_builders"


def installed_accelerators():
    """{accelerator name: 'module:Class'} of every installed accelerator, for ds_report."""
    return {name: ep.value for name, ep in entry_points_of(ACCELERATOR_GROUP).items()}


def installed_op_builders():
    """{builder class name: 'module:Class'} of every op builder registered by entry point."""
    return {name: ep.value for name, ep in entry_points_of(OP_BUILDER_GROUP).items()}


def load_accelerator_class(name, source="accelerator"):
    """The accelerator class registered as `name`; `source` names where the name came from."""
    from deepspeed.accelerator.abstract_accelerator import DeepSpeedAccelerator

    available = entry_points_of(ACCELERATOR_GROUP)
    entry_point = available.get(name)
    if entry_point is None:
        matches = [ep for key, ep in available.items() if key.lower() == name.lower()]
        entry_point = matches[0] if len(matches) == 1 else None
    if entry_point is None:
        installed = ", ".join(available) or "none"
        raise ValueError(f"{source}={name!r} is not an installed accelerator; installed accelerators "
                         f"(entry-point group '{ACCELERATOR_GROUP}'): {installed}")
    try:
        accelerator_class = entry_point.load()
    except Exception as err:
        raise ImportError(f"accelerator {entry_point.name!r} could not be loaded from "
                          f"{entry_point.value!r}: {err}") from err
    if not (isinstance(accelerator_class, type) and issubclass(accelerator_class, DeepSpeedAccelerator)):
        raise TypeError(f"entry point {entry_point.name!r} = {entry_point.value!r} in group "
                        f"'{ACCELERATOR_GROUP}' is {accelerator_class!r}, not a DeepSpeedAccelerator subclass")
    return accelerator_class


def _import_optional(module_name):
    """The module, or None when it (or a parent package) does not exist.

    A ModuleNotFoundError about some other module comes from inside the module and is a real bug,
    so it propagates.
    """
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as err:
        missing = err.name or ""
        if module_name == missing or module_name.startswith(missing + "."):
            return None
        raise


def find_op_builder(class_name, module_name):
    """The op builder class `class_name`: entry point first, then an attribute of `module_name`."""
    if not isinstance(class_name, str) or not class_name.isidentifier():
        raise ValueError(f"op builder class name must be an identifier string, got {class_name!r}")
    entry_point = entry_points_of(OP_BUILDER_GROUP).get(class_name)
    if entry_point is not None:
        try:
            return entry_point.load()
        except Exception as err:
            raise ImportError(f"op builder {class_name!r} could not be loaded from "
                              f"{entry_point.value!r}: {err}") from err
    module = _import_optional(module_name)
    if module is None:
        return None
    builder = getattr(module, class_name, None)
    return builder if isinstance(builder, type) else None
