"""Mirror the installed `deepspeed` package layout as a plain folder tree, for the API reference.

The repository maps several folders onto the one `deepspeed` namespace (setup.py's
`package_map()`: `core/` is `deepspeed`, `plugins/zero/` is `deepspeed.zero`, shims under
`runtime_compat/` and `upstream_paths/` spell the upstream import paths). mkdocstrings reads
sources statically through griffe, which expects a package to be one folder, so the docs build
copies the Python files into `<target>/deepspeed/...` exactly as a wheel would lay them out and
points griffe there. Nothing is imported: building the docs does not need torch to start.

    python tools/docs/package_tree.py build/docs/api_src
"""
import os
import runpy
import shutil
import sys
from pathlib import Path
from unittest import mock

ROOT = Path(__file__).resolve().parents[2]


def package_map(root: Path = ROOT) -> dict:
    """setup.py's {import name: folder} map, read without building anything."""
    import setuptools

    env = {k: v for k, v in os.environ.items() if not k.startswith("DS_BUILD_")}
    with mock.patch.object(setuptools, "setup", lambda **kwargs: None), \
            mock.patch.dict(os.environ, env, clear=True):
        namespace = runpy.run_path(str(root / "setup.py"), run_name="package_map_for_docs")
    return namespace["package_map"]()


def build_tree(target, root: Path = ROOT) -> Path:
    """Write the package tree under `target` (replaced as a whole); returns `target`."""
    target = Path(target)
    staging = target.with_name(target.name + ".tmp")
    shutil.rmtree(staging, ignore_errors=True)
    for name, folder in sorted(package_map(root).items()):
        destination = staging.joinpath(*name.split("."))
        destination.mkdir(parents=True, exist_ok=True)
        for source in sorted((root / folder).glob("*.py")):
            shutil.copy2(source, destination / source.name)
    shutil.rmtree(target, ignore_errors=True)
    staging.rename(target)
    return target


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    print(build_tree(sys.argv[1]))
