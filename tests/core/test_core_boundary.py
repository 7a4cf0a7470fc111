"""The core knows no plugin: every module under ``core/`` is parsed and checked for

- imports of a plugin's package (``deepspeed.zero``, ``deepspeed.runtime.zero``, ...);
- a plugin's config section named in code (``"zero_optimization"``, ``"tensorboard"``, ...):
  the core reads settings only through the section models the plugins register;
- ZeRO's parameter attributes (``ds_status``, ``ds_tensor``, ...);
- another object's private attributes (``engine.precision._pairs``, ``accelerator._name``):
  what crosses the boundary is declared in ``deepspeed.hooks``.

Docstrings and comments may mention anything. Each exception below carries its reason; the
checker itself is tested on planted violations, so an empty result means something.
"""
import ast
from pathlib import Path

import pytest

from deepspeed.plugin_manager import PluginCatalog, installed_plugins

CORE = Path(__file__).resolve().parents[2] / "core"

ZERO_ATTRIBUTES = {"ds_status", "ds_tensor", "ds_id", "ds_numel", "ds_shape", "ds_persist",
                   "ds_partitioner", "ds_process_group", "ds_external_users",
                   "ds_active_sub_modules", "ds_summary"}

# core file (relative to core/) -> (the section names it may hold, why)
ALLOWED_SECTION_NAMES = {
    "config/feature_sections.py": (
        "*", "the table of documented feature sections, so that a section whose plugin is not "
             "installed gets 'no installed plugin provides it' instead of 'unknown key'; the "
             "core validates none of them"),
    "config/config.py": (
        {"tensorboard", "wandb", "csv_monitor", "comet"},
        "DeepSpeedConfig.monitor_config is upstream's documented attribute (Monitor tutorial: "
        "MonitorMaster(ds_config.monitor_config)); it returns those sections as written"),
    "comm/observers.py": (
        {"comms_logger"}, "deepspeed.comm.configure(deepspeed_config=...) is documented to "
                          "read the comms_logger section itself (the core owns deepspeed.comm)"),
    "utils/groups.py": (
        {"sequence_parallel_size"}, "named in the error telling the user which key creates "
                                    "the missing sequence-parallel group"),
}


def _section_allowed(relpath, text):
    names, _why = ALLOWED_SECTION_NAMES.get(relpath, ((), ""))
    return names == "*" or text in names

# private attributes of torch objects the core may use, with why
ALLOWED_PRIVATE = {
    "_values": "torch.Tensor._values(): the documented accessor of a coalesced sparse tensor",
    "_indices": "torch.Tensor._indices(): the documented accessor of a coalesced sparse tensor",
}


def plugin_packages():
    """``deepspeed.<plugin>`` for every installed plugin whose code is part of this package,
    and the ``deepspeed.runtime.<name>`` compatibility packages plugins ship."""
    names = set()
    for spec in installed_plugins().values():
        module = spec.value.split(":")[0]
        parts = module.split(".")
        if parts[0] == "deepspeed" and len(parts) > 1:
            names.add(".".join(parts[:2]))
    plugins_dir = CORE.parent / "plugins"
    for folder in plugins_dir.iterdir() if plugins_dir.is_dir() else ():
        if (folder / "runtime_compat" / "__init__.py").is_file():
            names.add(f"deepspeed.runtime.{'sequence_parallel' if folder.name == 'sequence' else folder.name}")
    return names


def plugin_sections():
    return set(PluginCatalog().owners)


def _docstring_nodes(tree):
    """The string constants that are docstrings (module, class, function)."""
    nodes = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                nodes.add(id(body[0].value))
    return nodes


def _imported_roots(tree):
    """Local name -> module it came from, for names bound by imports."""
    roots = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                roots[(alias.asname or alias.name).split(".")[0]] = alias.name
        elif isinstance(node, ast.ImportFrom) and node.module:
            for alias in node.names:
                roots[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    return roots


def _root_name(node):
    while isinstance(node, (ast.Attribute, ast.Subscript, ast.Call)):
        node = node.func if isinstance(node, ast.Call) else node.value
    return node.id if isinstance(node, ast.Name) else None


def violations(source, relpath, packages, sections):
    """Every boundary violation in one module's source, as ``"path:line: what"``."""
    tree = ast.parse(source)
    docstrings = _docstring_nodes(tree)
    roots = _imported_roots(tree)
    found = []

    def report(node, what):
        found.append(f"{relpath}:{node.lineno}: {what}")

    def is_plugin(module):
        return any(module == p or module.startswith(p + ".") for p in packages)

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if is_plugin(alias.name):
                    report(node, f"imports plugin package {alias.name}")
        elif isinstance(node, ast.ImportFrom) and node.module:
            if is_plugin(node.module):
                report(node, f"imports plugin package {node.module}")
                continue
            for alias in node.names:
                if is_plugin(f"{node.module}.{alias.name}"):
                    report(node, f"imports plugin package {node.module}.{alias.name}")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) \
                and id(node) not in docstrings:
            text = node.value
            if _section_allowed(relpath, text):
                continue
            if text in sections:
                report(node, f"names the plugin config section {text!r}")
            elif text.startswith("zero_optimization"):
                report(node, f"names ZeRO's config key {text!r}")
            elif text in ZERO_ATTRIBUTES:
                report(node, f"names ZeRO's parameter attribute {text!r}")
        elif isinstance(node, ast.Attribute):
            if node.attr in ZERO_ATTRIBUTES:
                report(node, f"reads ZeRO's parameter attribute .{node.attr}")
            elif node.attr.startswith("_") and not node.attr.startswith("__") \
                    and node.attr not in ALLOWED_PRIVATE:
                owner = node.value
                own = isinstance(owner, ast.Name) and owner.id in ("self", "cls") or (
                    isinstance(owner, ast.Call) and isinstance(owner.func, ast.Name)
                    and owner.func.id == "super")
                root = _root_name(owner)
                external = root in roots and not roots[root].startswith("deepspeed")
                if not own and not external:
                    report(node, f"reads another object's private attribute "
                                 f"{ast.unparse(node)}")
    return found


def core_modules():
    return sorted(CORE.rglob("*.py"))


def test_core_names_no_plugin_and_reads_no_private_state():
    packages, sections = plugin_packages(), plugin_sections()
    assert "deepspeed.zero" in packages and "zero_optimization" in sections  # the check is live
    found = []
    for path in core_modules():
        found += violations(path.read_text(encoding="utf-8"),
                            path.relative_to(CORE).as_posix(), packages, sections)
    assert not found, "the core crosses into plugins:\n" + "\n".join(found)


@pytest.mark.parametrize("planted,expected", [
    ("from deepspeed.zero import Init", "imports plugin package deepspeed.zero"),
    ("from deepspeed import zero", "imports plugin package deepspeed.zero"),
    ("import deepspeed.runtime.zero.stage3", "imports plugin package deepspeed.runtime.zero"),
    ("stage = config.raw['zero_optimization']", "names the plugin config section"),
    ("x = raw.get('zero_optimization.stage')", "names ZeRO's config key"),
    ("ok = param.ds_status == 1", "reads ZeRO's parameter attribute .ds_status"),
    ("v = getattr(param, 'ds_tensor')", "names ZeRO's parameter attribute"),
    ("pairs = engine.precision._pairs", "private attribute engine.precision._pairs"),
    ("n = accelerator._name", "private attribute accelerator._name"),
])
def test_the_checker_catches_planted_violations(planted, expected):
    source = f'"""a docstring may say zero_optimization and ds_tensor"""\n{planted}\n'
    found = violations(source, "planted.py", {"deepspeed.zero", "deepspeed.runtime.zero"},
                       {"zero_optimization"})
    assert len(found) == 1 and expected in found[0], found


def test_the_checker_allows_own_and_third_party_private_names():
    source = ("import torch\n"
              "class A:\n"
              "    def f(self):\n"
              "        return self._x + super()._y() + torch._foreach_add\n")
    assert violations(source, "ok.py", {"deepspeed.zero"}, {"zero_optimization"}) == []
