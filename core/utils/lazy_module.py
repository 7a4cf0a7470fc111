"""A module imported on its first attribute access, for modules the launcher path imports.

The ``deepspeed`` runner loads every installed plugin (for their launcher flags) and the
accelerator (for device counts), and neither needs a tensor there: importing torch would cost
every launch seconds of CPU. Modules on that path whose code uses torch throughout (the CPU
accelerator's methods, a plugin's hooks) write ``torch = lazy_module("torch")`` instead of
``import torch``: the name behaves like the module (``torch.float32``, ``isinstance(x,
torch.device)``) but torch loads only when a hook or method first touches it.

Only for names used inside functions: a class that subclasses ``torch.nn.Module`` needs the
real module when its ``class`` statement runs, so such modules are imported lazily instead.
"""
import importlib


class LazyModule:
    """Stands in for the module ``name`` until an attribute is first read."""

    __slots__ = ("_name", "_module")

    def __init__(self, name):
        self._name = name
        self._module = None

    def __getattr__(self, attr):
        module = self._module
        if module is None:
            module = self._module = importlib.import_module(self._name)
        return getattr(module, attr)

    def __repr__(self):
        state = "loaded" if self._module is not None else "not loaded yet"
        return f"<lazy module {self._name!r} ({state})>"


def lazy_module(name):
    """A stand-in for ``import name`` that imports it on first attribute access."""
    return LazyModule(name)
