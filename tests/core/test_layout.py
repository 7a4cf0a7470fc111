"""House rules of the layout that a reviewer would otherwise have to check by eye."""
import ast
from pathlib import Path

from packaging.version import Version

import deepspeed

ROOT = Path(__file__).resolve().parents[2]


def _plugin_names(root):
    folder = root / "plugins"
    if not folder.is_dir():
        return set()
    return {p.name for p in folder.iterdir() if p.is_dir() and (p / "__init__.py").exists()}


def _imported_modules(path):
    tree = ast.parse(path.read_text(), filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.module


def plugin_imports_in_core(root):
    plugins = _plugin_names(root)
    offenders = []
    for path in (root / "core").rglob("*.py"):
        for module in _imported_modules(path):
            parts = module.split(".")
            if parts[0] == "plugins" or (parts[0] == "deepspeed" and len(parts) > 1
                                         and parts[1] in plugins):
                offenders.append(f"{path.relative_to(root)} imports {module}")
    return offenders


def test_core_imports_no_plugin():
    offenders = plugin_imports_in_core(ROOT)
    assert not offenders, "core/ must reach plugins only through hooks:\n" + "\n".join(offenders)


def test_plugin_import_checker_catches_both_spellings(tmp_path):
    (tmp_path / "plugins" / "zero").mkdir(parents=True)
    (tmp_path / "plugins" / "zero" / "__init__.py").write_text("")
    (tmp_path / "core").mkdir()
    (tmp_path / "core" / "engine.py").write_text(
        "import deepspeed.zero.stage3\nfrom plugins.zero import x\nimport deepspeed.comm\n")
    assert plugin_imports_in_core(tmp_path) == [
        "core/engine.py imports deepspeed.zero.stage3", "core/engine.py imports plugins.zero"]


def test_version_declares_the_implemented_api_level():
    version = Version(deepspeed.__version__)  # raises if not PEP 440
    assert version >= Version("0.14")


def test_folders_map_onto_the_deepspeed_namespace():
    import deepspeed.accelerator
    import deepspeed.ops.op_builder

    assert Path(deepspeed.__file__).parent == ROOT / "core"
    assert Path(deepspeed.accelerator.__file__).parent == ROOT / "accelerators"
    assert Path(deepspeed.ops.op_builder.__file__).parent == ROOT / "op_builder"


TOP_LEVEL = {".ci", ".gitignore", "README.md", "accelerators", "constraints.txt", "core", "csrc",
             "docs", "examples", "mkdocs.yml", "op_builder", "plugins", "pyproject.toml",
             "setup.py", "tests", "tools"}


def test_the_repository_root_holds_only_the_project():
    """Monitor output (tb/, csv folders) or a downloaded wheel written into the checkout by a
    manual run is easy to commit with ``git add -A``; a new top-level entry is added here on
    purpose or not at all."""
    import shutil
    import subprocess

    import pytest

    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True,
                             check=True).stdout.split()
    assert {path.split("/")[0] for path in tracked} - TOP_LEVEL == set()
