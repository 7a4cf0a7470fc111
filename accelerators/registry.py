"""Entry-point discovery of accelerators and op builders (see `deepspeed.utils.entry_points`:
a third-party registration of a built-in name replaces the built-in).

This module only finds what is installed; it knows nothing of the accelerator classes, so that
`abstract_accelerator` (which looks its op builders up here) can depend on it without a circle.
Loading an accelerator by name and checking it is a `DeepSpeedAccelerator` is part of choosing
one: `real_accelerator.load_accelerator_class`.
"""
from __future__ import annotations

import importlib

from deepspeed.utils.entry_points import entry_points_of

ACCELERATOR_GROUP = "deepspeed.accelerators"
OP_BUILDER_GROUP = "deepspeed.op_builders"


def accelerator_entry_points():
    """{accelerator name: entry point} of every installed accelerator, not loaded yet."""
    return entry_points_of(ACCELERATOR_GROUP)


def installed_accelerators():
    """{accelerator name: 'module:Class'} of every installed accelerator, for ds_report."""
    return {name: ep.value for name, ep in accelerator_entry_points().items()}


def installed_op_builders():
    """{builder class name: 'module:Class'} of every op builder registered by entry point."""
    return {name: ep.value for name, ep in entry_points_of(OP_BUILDER_GROUP).items()}


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
