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


def import_submodule(package, name):
    """The submodule ``<package>.<name>``, imported; None when ``package`` has no such
    submodule (an import error inside an existing one propagates).

    Upstream's ``import deepspeed`` imports nearly every subpackage, so scripts and the docs
    reach ``deepspeed.moe.layer.MoE`` or ``deepspeed.runtime.zero.config.DeepSpeedZeroConfig``
    by attribute access alone; here a package's submodules load when first read that way."""
    if name.startswith("__"):  # protocol probes (__wrapped__, __path__ ...) are never modules
        return None
    full = f"{package}.{name}"
    try:
        return importlib.import_module(full)
    except ModuleNotFoundError as exc:
        if exc.name != full:
            raise
        return None


def lazy_exports(package, exports=None):
    """``(__getattr__, __dir__)`` for the package named ``package`` (pass ``__name__``): each
    name of ``exports`` ({name: full module path}) is read from its module on first access and
    kept in the package's namespace afterwards; any other name is the package's submodule of
    that name (``import_submodule``), else an ``AttributeError``. Without ``exports`` it only
    makes the submodules reachable as attributes."""
    namespace = sys.modules[package].__dict__
    exports = exports or {}

    def __getattr__(name):
        module = exports.get(name)
        if module is None:
            submodule = import_submodule(package, name)
            if submodule is None:
                raise AttributeError(f"module '{package}' has no attribute '{name}'")
            return submodule  # the import bound it in the namespace
        value = getattr(importlib.import_module(module), name)
        namespace[name] = value
        return value

    def __dir__():
        return sorted(set(namespace) | set(exports))

    return __getattr__, __dir__


#: entry-point groups through which installed plugins add names to a core module: the group
#: ``deepspeed.exports.<module path after "deepspeed.">`` lists, per plugin, a module whose
#: ``__all__`` names join that core module (``deepspeed.exports.utils.groups`` -> the expert
#: groups of ``deepspeed.moe.groups`` in ``deepspeed.utils.groups``); ``deepspeed.exports``
#: itself is the top-level ``deepspeed`` (``deepspeed.InferenceEngine``)
EXPORTS_GROUP_PREFIX = "deepspeed.exports."


def exports_group(package):
    """The entry-point group whose modules export names into the core module ``package``."""
    if package == "deepspeed":
        return EXPORTS_GROUP_PREFIX.rstrip(".")
    return EXPORTS_GROUP_PREFIX + package[len("deepspeed."):]


def plugin_exports(package, dynamic=None, upstream=None):
    """``(__getattr__, __dir__)`` for the core module ``package`` (pass ``__name__``) whose
    upstream namespace holds names a plugin owns (``deepspeed.utils.set_z3_leaf_modules``
    is ZeRO's). A name is first looked up in ``dynamic`` ({name: function computing its value
    on each access}), then in the modules installed plugins
    register under the entry-point group ``EXPORTS_GROUP_PREFIX + <package after deepspeed.>``
    (read from the installed metadata, so the core imports no plugin). A found name is kept
    in the module's namespace; two plugins exporting one name is an error naming both.
    ``upstream`` is the name the group is read for when it is not ``package`` (a core module
    installed at an upstream path under a second name)."""
    from deepspeed.utils.entry_points import entry_points_of

    namespace = sys.modules[package].__dict__
    group = exports_group(upstream or package)

    def exported():
        table = {}
        for plugin, entry_point in entry_points_of(group).items():
            module = importlib.import_module(entry_point.value)
            for name in getattr(module, "__all__", ()):
                if name in table and table[name][1] is not module:
                    raise ImportError(f"plugins '{table[name][0]}' and '{plugin}' both export "
                                      f"{package}.{name} (entry-point group '{group}')")
                table[name] = (plugin, module)
        return table

    def __getattr__(name):
        if dynamic and name in dynamic:
            return dynamic[name]()
        if name.startswith("__"):
            raise AttributeError(f"module '{package}' has no attribute '{name}'")
        found = exported().get(name)
        if found is None:
            raise AttributeError(f"module '{package}' has no attribute '{name}' (nor does any "
                                 f"installed plugin export it under '{group}')")
        value = getattr(found[1], name)
        namespace[name] = value
        return value

    def __dir__():
        return sorted(set(namespace) | set(dynamic or ()) | set(exported()))

    return __getattr__, __dir__
