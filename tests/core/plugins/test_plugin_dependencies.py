"""A plugin uses another only through that plugin's package API (the names its package
``__init__`` exports) and declares it in ``depends_on``; the catalog refuses to load a plugin
whose dependency is not installed, naming both."""
import ast
import importlib
from pathlib import Path

import pytest

from deepspeed.plugin_manager import (DeepSpeedPlugin, PluginCatalog, PluginError, PluginSpec,
                                      installed_plugins)

ROOT = Path(__file__).resolve().parents[3]
RUNTIME_NAMES = {"sequence": "sequence_parallel", "data_efficiency": "data_pipeline"}


def plugin_packages():
    """{plugin name: its package (``deepspeed.zero``)} of the plugins shipped in plugins/."""
    found = {}
    for name, spec in installed_plugins().items():
        parts = spec.value.split(":")[0].split(".")
        if parts[0] == "deepspeed" and len(parts) > 1 and (ROOT / "plugins" / parts[1]).is_dir():
            found[name] = ".".join(parts[:2])
    return found


def cross_plugin_imports(source, own_package, packages):
    """``[(line, other plugin, what)]``: each import of another plugin, ``what`` being None when
    it goes through the package itself (with the names imported) or the offending module path."""
    others = {package: name for name, package in packages.items() if package != own_package}
    runtime = {f"deepspeed.runtime.{RUNTIME_NAMES.get(p.split('.')[1], p.split('.')[1])}": name
               for p, name in others.items()}
    found = []

    def owner(module):
        for table in (others, runtime):
            for package, name in table.items():
                if module == package or module.startswith(package + "."):
                    return name, package, table is runtime
        return None

    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module and not node.level:
            hit = owner(node.module)
            if hit is not None:
                name, package, via_runtime = hit
                names = [alias.name for alias in node.names]
                deep = node.module != package or via_runtime
                found.append((node.lineno, name, node.module if deep else names))
        elif isinstance(node, ast.Import):
            for alias in node.names:
                hit = owner(alias.name)
                if hit is not None:
                    found.append((node.lineno, hit[0], alias.name))
    return found


def test_plugins_use_each_other_only_through_declared_package_apis():
    packages = plugin_packages()
    catalog = PluginCatalog()
    problems = []
    for name, package in sorted(packages.items()):
        folder = ROOT / "plugins" / package.split(".")[1]
        declared = set(getattr(catalog.plugins[name], "depends_on", ()))
        for path in sorted(folder.rglob("*.py")):
            relpath = path.relative_to(ROOT).as_posix()
            for line, other, what in cross_plugin_imports(path.read_text(encoding="utf-8"),
                                                          package, packages):
                if other not in declared:
                    problems.append(f"{relpath}:{line}: imports plugin '{other}' without "
                                    f"declaring it in {name}'s depends_on")
                if isinstance(what, str):
                    problems.append(f"{relpath}:{line}: imports {what}; use the package API "
                                    f"of {packages[other]} instead")
                    continue
                exported = set(getattr(importlib.import_module(packages[other]), "__all__", ()))
                for missing in sorted(set(what) - exported):
                    problems.append(f"{relpath}:{line}: {missing} is not in "
                                    f"{packages[other]}.__all__")
    assert not problems, "\n".join(problems)


def test_declared_dependencies_are_used():
    """A ``depends_on`` nobody imports is stale: it would refuse installs for nothing."""
    packages = plugin_packages()
    catalog = PluginCatalog()
    for name, package in packages.items():
        folder = ROOT / "plugins" / package.split(".")[1]
        used = {other for path in folder.rglob("*.py")
                for _, other, _ in cross_plugin_imports(path.read_text(encoding="utf-8"),
                                                        package, packages)}
        assert set(getattr(catalog.plugins[name], "depends_on", ())) <= used, name


def test_the_checker_sees_deep_and_undeclared_imports():
    packages = {"a": "deepspeed.a", "b": "deepspeed.b"}
    source = ("from deepspeed.b import Api\n"
              "from deepspeed.b.layers import Inner\n"
              "import deepspeed.runtime.b.x\n"
              "from deepspeed.a.own import Mine\n")
    assert cross_plugin_imports(source, "deepspeed.a", packages) == [
        (1, "b", ["Api"]), (2, "b", "deepspeed.b.layers"), (3, "b", "deepspeed.runtime.b.x")]


class _Needs(DeepSpeedPlugin):
    depends_on = ("absent",)


def test_a_missing_dependency_names_both(monkeypatch):
    import deepspeed.plugin_manager as pm

    monkeypatch.setattr(pm, "_load_entry_point", lambda name, value: _Needs)
    with pytest.raises(PluginError, match="plugin 'needy' depends on plugin 'absent'"):
        PluginCatalog({"needy": PluginSpec("needy", "x:Needs", "dist", "0")})
