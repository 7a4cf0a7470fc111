"""Maps the repository folders onto the single `deepspeed` import namespace.

pyproject.toml holds the static metadata; this file exists because the package list is derived
from the folder layout (every `plugins/<name>/` becomes `deepspeed.<name>`), which a static
table cannot express without being edited for each new plugin.
"""
import os

from setuptools import setup

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


def package_map():
    roots = dict(ROOTS)
    plugins_dir = os.path.join(ROOT, "plugins")
    if os.path.isdir(plugins_dir):
        for entry in sorted(os.listdir(plugins_dir)):
            if os.path.isfile(os.path.join(plugins_dir, entry, "__init__.py")):
                roots[os.path.join("plugins", entry)] = "deepspeed." + entry
    mapping = {}
    for folder, import_name in roots.items():
        mapping.update(dict(_walk(folder, import_name)))
    return mapping


PACKAGE_DIR = package_map()

setup(
    packages=sorted(PACKAGE_DIR),
    package_dir=PACKAGE_DIR,
)
