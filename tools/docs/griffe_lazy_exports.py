"""Griffe extension: show the names a package exports lazily as what they are, re-exports.

`deepspeed` and its plugin packages export their public names lazily (PEP 562 `__getattr__`
over a module-level table `{name: defining module}`, see `deepspeed.utils.lazy_exports`), so
that `import deepspeed` stays cheap. Griffe reads sources statically and would not see
`deepspeed.initialize` or `deepspeed.zero.Init`; this extension reads those tables and adds
each name as an alias of `<module>.<name>`, the same object a user gets at run time.

Names installed plugins export into a core module (`deepspeed.InferenceEngine`,
`deepspeed.utils.set_z3_leaf_modules`) come from entry points instead: pyproject.toml's group
`deepspeed.exports[.<module>]` names, per plugin, a module whose `__all__` joins that core
module. The extension reads those groups from pyproject.toml and each listed module's `__all__`
from its source, and adds the names the same way.

Used by mkdocs.yml (mkdocstrings' python handler `extensions`).
"""
import ast
from pathlib import Path

import griffe

#: module-level tables of lazily exported names, as the packages spell them
EXPORT_TABLES = ("_LAZY", "_EXPORTS")
PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"
EXPORTS_GROUP = "deepspeed.exports"  # deepspeed.utils.lazy_exports.exports_group's prefix


def plugin_exports(pyproject=PYPROJECT):
    """{core module: [exporting module, ...]} from the `deepspeed.exports*` entry-point groups
    (Python < 3.11 has no tomllib: the installed package's metadata holds the same groups)."""
    try:
        import tomllib
    except ModuleNotFoundError:
        from importlib.metadata import entry_points

        groups = {}
        for entry in entry_points():
            groups.setdefault(entry.group, {})[entry.name] = entry.value
    else:
        groups = tomllib.loads(pyproject.read_text(encoding="utf-8"))["project"]["entry-points"]
    found = {}
    for group, entries in groups.items():
        if group == EXPORTS_GROUP or group.startswith(EXPORTS_GROUP + "."):
            target = "deepspeed" + group[len(EXPORTS_GROUP):]
            found[target] = list(entries.values())
    return found


def _source_of(module_path, mod):
    """The source file of `module_path` in the tree `mod` (a module of it) was read from."""
    depth = len(mod.path.split(".")) + (0 if mod.filepath.name == "__init__.py" else -1)
    root = mod.filepath.parents[depth]
    base = root.joinpath(*module_path.split("."))
    return base / "__init__.py" if base.is_dir() else base.with_suffix(".py")


def _all_of(path):
    """The literal `__all__` of a source file ([] without one)."""
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__all__"
                                                for t in node.targets):
            return list(ast.literal_eval(node.value))
    return []


def _public_defs(path):
    """The top-level public functions and classes of a source file."""
    return [node.name for node in ast.parse(path.read_text(encoding="utf-8")).body
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and not node.name.startswith("_")]


def _module_it_stands_for(path):
    """``P.X`` when the source at ``path`` replaces itself with ``sys.modules[__name__] = X``
    after ``from P import X`` (an upstream-path shim), else None."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    imported = {alias.asname or alias.name: f"{node.module}.{alias.name}"
                for node in tree.body if isinstance(node, ast.ImportFrom) and node.module
                for alias in node.names}
    for node in tree.body:
        if (isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Subscript)
                and ast.unparse(node.targets[0]) == "sys.modules[__name__]"
                and isinstance(node.value, ast.Name)):
            return imported.get(node.value.id)
    return None


class LazyExports(griffe.Extension):
    def __init__(self):
        super().__init__()
        self._plugin_exports = plugin_exports()

    def on_module_members(self, *, mod, **kwargs):
        for table in EXPORT_TABLES:
            attribute = mod.members.get(table)
            if attribute is None or attribute.value is None:
                continue
            try:
                exports = ast.literal_eval(str(attribute.value))
            except (ValueError, SyntaxError) as err:
                raise ValueError(f"{mod.path}.{table} must be a plain dict literal (the docs "
                                 f"build reads it without running code): {err}") from None
            for name, module in exports.items():
                self._alias(mod, name, module)
        for module in self._plugin_exports.get(mod.path, ()):
            for name in _all_of(_source_of(module, mod)):
                self._alias(mod, name, module)
        if isinstance(mod.filepath, Path):
            stands_for = _module_it_stands_for(mod.filepath)
            if stands_for:  # deepspeed.utils.groups is deepspeed.topology.groups
                source = _source_of(stands_for, mod)
                for name in _all_of(source) or _public_defs(source):
                    self._alias(mod, name, stands_for)

    @staticmethod
    def _alias(mod, name, module):
        if name not in mod.members:
            mod.set_member(name, griffe.Alias(name, f"{module}.{name}", parent=mod))
