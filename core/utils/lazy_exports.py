"""Package namespaces whose names load on first use (PEP 562 module ``__getattr__``).

``deepspeed.initialize`` loads every installed plugin's entry point to learn the whole config
schema, and loading ``deepspeed.<plugin>.plugin`` runs the package's ``__init__`` first. When
those ``__init__``s imported their implementations, every run paid for every feature: the
twelve built-in plugins imported 142 modules, 4.5 MiB of RSS and 63 ms per process (measured by
loading each entry point in turn, issue 14), whatever the config enabled. A package built with
``lazy_exports`` still offers ``from deepspeed.<plugin> import Name`` and ``dir()``; the module
behind a name is imported when the name is first read.
"""
import importlib
import sys


def lazy_exports(package, exports):
    """``(__getattr__, __dir__)`` for the package named ``package`` (pass ``__name__``): each
    name of ``exports`` ({name: full module path}) is read from its module on first access and
    kept in the package's namespace afterwards; any other name is an ``AttributeError``."""
    namespace = sys.modules[package].__dict__

    def __getattr__(name):
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module '{package}' has no attribute '{name}'")
        value = getattr(importlib.import_module(module), name)
        namespace[name] = value
        return value

    def __dir__():
        return sorted(set(namespace) | set(exports))

    return __getattr__, __dir__
