"""Maps the repository folders onto the single `deepspeed` import namespace.

pyproject.toml holds the static metadata; this file exists because the package list is derived
from the folder layout (every `plugins/<name>/` becomes `deepspeed.<name>`), which a static
table cannot express without being edited for each new plugin.
"""
import importlib.util
import os
import sys
import types

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = os.path.dirname(os.path.abspath(__file__))

# folder -> import name of that folder's top package
ROOTS = {
    "core": "deepspeed",
    "accelerators": "deepspeed.accelerator",
    "op_builder": "deepspeed.ops.op_builder",
}


def _walk(folder, import_name):
    """Yield (import name, folder) for a package folder and every sub-package under it."""
    for dirpath, dirnames, filenames in os.walk(os.path.join(ROOT, folder)):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith((".", "__")))
        if "__init__.py" not in filenames:
            dirnames[:] = []
            continue
        rel = os.path.relpath(dirpath, ROOT)
        suffix = os.path.relpath(dirpath, os.path.join(ROOT, folder))
        name = import_name if suffix == "." else import_name + "." + suffix.replace(os.sep, ".")
        yield name, rel


# A plugin's `runtime_compat/` folder holds the long upstream import paths of that feature
# (`deepspeed.runtime.zero.stage_1_and_2`, ...): it is mapped onto `deepspeed.runtime.<plugin>`
# so that the compatibility shims live with the plugin they re-export, and core/ never imports a
# plugin.
RUNTIME_COMPAT = "runtime_compat"
# Plugins whose upstream runtime path is not `deepspeed.runtime.<plugin>`.
RUNTIME_COMPAT_NAMES = {"sequence": "sequence_parallel", "data_efficiency": "data_pipeline"}

# A plugin's `upstream_paths/` folder holds shims for upstream import paths *anywhere* under
# `deepspeed` that name one of its features, in particular inside core packages
# (`deepspeed.utils.zero_to_fp32`, `deepspeed.checkpoint.ds_to_universal`): the folder path
# spells the import path, and each first folder on a branch holding an `__init__.py` becomes the
# package `deepspeed.<path with dots>` (with its sub-packages). The folders above it have no
# `__init__.py`: their names belong to core or another plugin, which never import the shim.
# `upstream_paths/` itself has no `__init__.py`, so it is never importable under the plugin's
# own name. A shim that would replace an existing package or module fails the build.
# `core/upstream_paths/` works the same way for core modules whose upstream path lies on a lower
# floor than they do (`deepspeed.utils.groups` is the process-group topology's view, which
# `deepspeed.utils`, below `deepspeed.comm`, cannot hold).
UPSTREAM_PATHS = "upstream_paths"


def _upstream_roots(plugin_folder):
    """(folder, import name) of each shim package under ``plugin_folder/upstream_paths/``."""
    base = os.path.join(ROOT, plugin_folder, UPSTREAM_PATHS)
    if os.path.isfile(os.path.join(base, "__init__.py")):
        raise RuntimeError(f"{plugin_folder}/{UPSTREAM_PATHS}/__init__.py: the folder only spells "
                           f"import paths and must not be a package itself")
    for dirpath, dirnames, filenames in os.walk(base):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith((".", "__")))
        if "__init__.py" in filenames:
            dirnames[:] = []  # its sub-packages come with it (_walk)
            rel = os.path.relpath(dirpath, base)
            yield os.path.relpath(dirpath, ROOT), "deepspeed." + rel.replace(os.sep, ".")


def _check_upstream_shims(mapping, shims):
    """A shim must add a name, never shadow one that core or another plugin provides."""
    for name, folder in shims.items():
        parent, _, leaf = name.rpartition(".")
        clash = mapping.get(name)
        if clash is None and parent in mapping:
            module = os.path.join(mapping[parent], leaf + ".py")
            clash = module if os.path.isfile(os.path.join(ROOT, module)) else None
        if clash is not None:
            raise RuntimeError(f"{folder} would be imported as {name}, which {clash} already is")


def package_map():
    roots = dict(ROOTS)
    shim_roots = dict(_upstream_roots("core"))
    plugins_dir = os.path.join(ROOT, "plugins")
    if os.path.isdir(plugins_dir):
        for entry in sorted(os.listdir(plugins_dir)):
            if os.path.isfile(os.path.join(plugins_dir, entry, "__init__.py")):
                roots[os.path.join("plugins", entry)] = "deepspeed." + entry
                compat = os.path.join("plugins", entry, RUNTIME_COMPAT)
                if os.path.isfile(os.path.join(ROOT, compat, "__init__.py")):
                    roots[compat] = "deepspeed.runtime." + RUNTIME_COMPAT_NAMES.get(entry, entry)
                shim_roots.update(_upstream_roots(os.path.join("plugins", entry)))
    mapping = {}
    for folder, import_name in roots.items():
        for name, path in _walk(folder, import_name):
            if path.endswith(os.sep + RUNTIME_COMPAT) or (os.sep + RUNTIME_COMPAT + os.sep) in path:
                if not name.startswith("deepspeed.runtime."):
                    continue  # only reachable under its upstream name
            mapping[name] = path
    shims = {}
    for folder, import_name in shim_roots.items():
        for name, path in _walk(folder, import_name):
            if name in shims:
                raise RuntimeError(f"{path} and {shims[name]} both claim {name}")
            shims[name] = path
    _check_upstream_shims(mapping, shims)
    mapping.update(shims)
    return mapping


# The native sources ship inside the wheel as deepspeed/ops/csrc so JIT builds work from a wheel
# (op_builder/builder.py finds them two levels up from itself in both layouts).
CSRC_PACKAGE = "deepspeed.ops.csrc"
CSRC_PATTERNS = ["*.md", "**/*.cpp", "**/*.h", "**/*.hpp", "**/*.cu", "**/*.cuh"]


def _import_op_builders():
    """Import `deepspeed.ops.op_builder` from this source tree without importing `deepspeed`.

    The package is not installed yet (or an older copy is), and its top-level __init__ needs the
    runtime dependencies; the builders need only their own package and `deepspeed.utils`.
    """
    stubs = {"deepspeed": os.path.join(ROOT, "core"), "deepspeed.ops": os.path.join(ROOT, "core", "ops")}
    saved = {k: v for k, v in sys.modules.items() if k == "deepspeed" or k.startswith("deepspeed.")}
    for key in saved:
        del sys.modules[key]
    for name, path in stubs.items():
        stub = types.ModuleType(name)
        stub.__path__ = [path]
        sys.modules[name] = stub
    spec = importlib.util.spec_from_file_location(
        "deepspeed.ops.op_builder", os.path.join(ROOT, "op_builder", "__init__.py"),
        submodule_search_locations=[os.path.join(ROOT, "op_builder")])
    package = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = package
    spec.loader.exec_module(package)
    return package, saved


def native_extensions():
    """(ext_modules, cmdclass) for DS_BUILD_* ahead-of-time builds; empty without any switch."""
    sys.path.insert(0, os.path.join(ROOT, "op_builder"))
    try:
        import aot  # op_builder/aot.py: plain Python, no torch
    finally:
        sys.path.pop(0)
    if not aot.any_build_requested(os.environ):
        return [], {}
    try:
        import torch  # noqa: F401  (only now: a JIT-mode install must not need torch to build)
    except ImportError as err:
        raise RuntimeError("DS_BUILD_* ahead-of-time op builds need torch in the build environment: "
                           "install torch first, then `pip install --no-build-isolation .`") from err
    package, saved = _import_op_builders()
    try:
        classes = [getattr(package, name) for name in package.BUILDER_MODULES]
        selected, skipped = aot.select_ops(classes, os.environ)
        extensions = [builder.builder() for builder in selected]
    finally:
        for key in [k for k in sys.modules if k == "deepspeed" or k.startswith("deepspeed.")]:
            del sys.modules[key]
        sys.modules.update(saved)
    for name, reason in skipped:
        print(f"[deepspeed] not pre-building op '{name}' (will JIT-load if possible): {reason}")
    print(f"[deepspeed] pre-building ops: {', '.join(b.NAME for b in selected) or 'none'}")
    from torch.utils.cpp_extension import BuildExtension

    return extensions, {"build_ext": BuildExtension}


class BuildPyRecordingGit(build_py):
    """Also writes ``deepspeed/git_version_info_installed.py`` into a built package: the commit
    and branch it was built from (``deepspeed.git_version_info``), which an installed wheel has
    no checkout to ask. An editable install reads its checkout instead, so writes nothing."""

    def run(self):
        super().run()
        if getattr(self, "editable_mode", False):
            return
        spec = importlib.util.spec_from_file_location(
            "_build_info", os.path.join(ROOT, "core", "utils", "build_info.py"))
        build_info = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(build_info)  # standard library only: no deepspeed, no torch
        target = os.path.join(self.build_lib, "deepspeed", build_info.INSTALLED_MODULE + ".py")
        build_info.write_installed_module(target, ROOT)


PACKAGE_DIR = package_map()
if os.path.isdir(os.path.join(ROOT, "csrc")):
    PACKAGE_DIR[CSRC_PACKAGE] = "csrc"
EXT_MODULES, CMDCLASS = native_extensions()

setup(
    packages=sorted(PACKAGE_DIR),
    package_dir=PACKAGE_DIR,
    # warm_site/ is a folder for PYTHONPATH (its sitecustomize), not a package
    package_data={CSRC_PACKAGE: CSRC_PATTERNS, "deepspeed.testing": ["warm_site/*.py"]},
    ext_modules=EXT_MODULES,
    cmdclass={"build_py": BuildPyRecordingGit, **CMDCLASS},
)
