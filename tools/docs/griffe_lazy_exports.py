"""Griffe extension: show the names a package exports lazily as what they are, re-exports.

`deepspeed` and its plugin packages export their public names lazily (PEP 562 `__getattr__`
over a module-level table `{name: defining module}`, see `deepspeed.utils.lazy_exports`), so
that `import deepspeed` stays cheap. Griffe reads sources statically and would not see
`deepspeed.initialize` or `deepspeed.zero.Init`; this extension reads those tables and adds
each name as an alias of `<module>.<name>`, the same object a user gets at run time.

Core modules also receive names from installed plugins (`deepspeed.utils.groups.initialize`
is MoE's), through the entry-point groups `deepspeed.exports.<module after deepspeed.>` of
pyproject.toml (`deepspeed.utils.lazy_exports.plugin_exports`). The extension reads those groups
from pyproject.toml and each exporting module's `__all__` from its source in the laid-out tree,
and adds the names as aliases too. A core module that replaces itself in `sys.modules` at an
upstream path (`deepspeed.utils.groups` is `deepspeed.topology.groups`) gets its real module's
public names the same way.

Used by mkdocs.yml (mkdocstrings' python handler `extensions`).
"""
import ast
import tomllib
from pathlib import Path

import griffe

ROOT = Path(__file__).resolve().parents[2]
EXPORTS_GROUP_PREFIX = "deepspeed.exports."

#: module-level tables of lazily exported names, as the packages spell them
EXPORT_TABLES = ("_LAZY", "_EXPORTS")


class LazyExports(griffe.Extension):
    def on_module_members(self, *, mod, **kwargs):
        for table in EXPORT_TABLES:
            attribute = mod.members.get(table)
            if attribute is None or attribute.value is None:
                continue
            exports = ast.literal_eval(str(attribute.value))
            for name, module in exports.items():
                if name not in mod.members:
                    mod.set_member(name, griffe.Alias(name, f"{module}.{name}", parent=mod))


def _plugin_export_groups():
    """{core module path: [exporting module path]} from pyproject.toml's entry points."""
    entry_points = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"]
    return {"deepspeed." + group[len(EXPORTS_GROUP_PREFIX):]: list(table.values())
            for group, table in entry_points.items() if group.startswith(EXPORTS_GROUP_PREFIX)}


def _source_of(module_path, tree_root):
    """The source file of ``module_path`` in the laid-out package tree, or None."""
    base = tree_root.joinpath(*module_path.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _public_names(source):
    """The literal ``__all__`` of a module's source, else its top-level public defs."""
    tree = ast.parse(source.read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__all__"
                                                for t in node.targets):
            return list(ast.literal_eval(node.value))
    return [node.name for node in tree.body
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and not node.name.startswith("_")]


def _module_it_stands_for(source):
    """``X`` when the module's source ends with ``sys.modules[__name__] = X`` after
    ``from P import X``: the full path ``P.X``, else None."""
    tree = ast.parse(source.read_text())
    imported = {alias.asname or alias.name: f"{node.module}.{alias.name}"
                for node in tree.body if isinstance(node, ast.ImportFrom) and node.module
                for alias in node.names}
    for node in tree.body:
        if (isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Subscript)
                and ast.unparse(node.targets[0]) == "sys.modules[__name__]"
                and isinstance(node.value, ast.Name)):
            return imported.get(node.value.id)
    return None


class PluginExports(griffe.Extension):
    """Names installed plugins export into a core module, and a shim module's real names."""

    def __init__(self):
        super().__init__()
        self._groups = _plugin_export_groups()

    def on_module_members(self, *, mod, **kwargs):
        if mod.filepath is None or not isinstance(mod.filepath, Path):
            return
        parts = mod.path.split(".")
        tree_root = Path(mod.filepath)
        for _ in range(len(parts) + (mod.filepath.name == "__init__.py")):
            tree_root = tree_root.parent
        sources = list(self._groups.get(mod.path, ()))
        stands_for = _module_it_stands_for(Path(mod.filepath))
        if stands_for:
            sources.insert(0, stands_for)
        for module in sources:
            source = _source_of(module, tree_root)
            if source is None:
                continue
            for name in _public_names(source):
                if name not in mod.members:
                    mod.set_member(name, griffe.Alias(name, f"{module}.{name}", parent=mod))
