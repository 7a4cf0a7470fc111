"""No module outside ``deepspeed.topology`` keeps process groups in module-level state.

Groups kept in module globals were how five places answered "which ranks share this tensor":
``core/utils/groups.py``'s expert tables, ``sequence/parallel_state.py``'s ``_state``, the
registered ``mpu``, MiCS's ``_CACHE`` ... Each could go stale or disagree with the others. Now
``deepspeed.topology`` holds them all (its two slots are the only module-level ones), and units
(``mpu``s) and ``deepspeed.utils.groups`` are views onto it.

The check reads every module of core/ and plugins/ and reports a module-level name that looks
like it holds groups (its name says group, mpu, mesh, grid, topology, parallel, cache or
state) when it
is bound to a container, ``None`` or a call, or rebound through ``global`` (a constant, a
table of constants such as ``ROW_PARALLEL_NAMES``, or an alias of a function is fine).
Exceptions carry their reason; the checker is tested on planted globals.
"""
import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TOPOLOGY = "core/topology/__init__.py"
SUSPECT = re.compile(r"group|mpu|mesh|grid|topolog|parallel|cache|"
                     r"(^|_)(state|current|process)$", re.IGNORECASE)

# (file, name) -> why it is not a process-group global
ALLOWED = {
    ("core/comm/state.py", "_group_timeouts"): (
        "deepspeed.comm's record of the timeout each group was created with (for error "
        "messages); it creates no group and answers no 'which ranks' question"),
    ("core/activation_checkpointing/settings.py", "_STATE"): (
        "what deepspeed.checkpointing.configure(mpu_, ...) was given, read by every "
        "checkpoint() call deep inside model code (upstream's process-wide API); it holds the "
        "caller's unit, not groups of its own"),
    ("plugins/compression/compress.py", "SNIP_DEFAULT_GROUP"): (
        "a pruning group (which modules SNIP prunes), a config default, not a process group"),
    ("plugins/moe/groups.py", "_EXPERT_PARALLEL_GROUP"): (
        "upstream's dict name as a live view onto the current topology's expert dimension; "
        "it holds no group"),
    ("plugins/moe/groups.py", "_EXPERT_DATA_PARALLEL_GROUP"): (
        "upstream's dict name as a live view onto the current topology's expert-data "
        "dimension; it holds no group"),
}


def _constant(value):
    """A literal made of constants only (a table of names: ``("exp_avg", "exp_avg_sq")``)."""
    if isinstance(value, ast.Constant):
        return value.value is not None
    if isinstance(value, (ast.Tuple, ast.List, ast.Set)):
        return bool(value.elts) and all(_constant(e) for e in value.elts)
    if isinstance(value, ast.Dict):
        return bool(value.keys) and all(k is not None and _constant(k) and _constant(v)
                                        for k, v in zip(value.keys, value.values))
    return False


def _holds_state(value):
    if isinstance(value, ast.Constant):
        return value.value is None
    return not _constant(value) and isinstance(
        value, (ast.Dict, ast.List, ast.Set, ast.Tuple, ast.Call, ast.DictComp, ast.ListComp,
                ast.SetComp))


def _module_level(tree):
    """Statements run at import: the module body, through ``if`` / ``try`` / ``with``."""
    stack = list(tree.body)
    while stack:
        node = stack.pop()
        yield node
        if isinstance(node, (ast.If, ast.Try, ast.With)):
            for field in ("body", "orelse", "finalbody", "handlers"):
                stack.extend(getattr(node, field, []))
        elif isinstance(node, ast.ExceptHandler):
            stack.extend(node.body)


def group_globals(source, relpath):
    """``["path:line: name"]`` of the module-level process-group state in one module."""
    tree = ast.parse(source)
    found = []
    for node in _module_level(tree):
        targets, value = [], None
        if isinstance(node, ast.Assign):
            targets, value = node.targets, node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            targets, value = [node.target], node.value
        for target in targets:
            if isinstance(target, ast.Name) and SUSPECT.search(target.id) \
                    and _holds_state(value):
                found.append((node.lineno, target.id))
    for node in ast.walk(tree):
        if isinstance(node, ast.Global):
            found += [(node.lineno, name) for name in node.names if SUSPECT.search(name)]
    return [f"{relpath}:{line}: {name}" for line, name in sorted(set(found))
            if (relpath, name) not in ALLOWED]


def test_only_the_topology_keeps_process_groups_in_module_state():
    found = []
    for folder in ("core", "plugins", "accelerators"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            relpath = path.relative_to(ROOT).as_posix()
            if relpath != TOPOLOGY:
                found += group_globals(path.read_text(encoding="utf-8"), relpath)
    assert not found, ("module-level process-group state outside deepspeed.topology (add a "
                       "dimension to the topology instead):\n" + "\n".join(found))


def test_the_topology_module_is_where_they_are():
    found = group_globals((ROOT / TOPOLOGY).read_text(encoding="utf-8"), TOPOLOGY)
    assert found, "the checker no longer sees the topology's own slots"


def test_allowed_globals_exist_and_give_a_reason():
    for (relpath, name), why in ALLOWED.items():
        assert why.strip()
        tree = ast.parse((ROOT / relpath).read_text(encoding="utf-8"))
        assert any(isinstance(node, (ast.Assign, ast.AnnAssign)) and name in ast.unparse(node)
                   for node in _module_level(tree)), f"{relpath}: {name} is gone; drop it"


def test_the_checker_catches_planted_globals():
    planted = ("GRADIENT_GROUP = 'ds_gradient_group'\n"  # a constant: fine
               "get_data_parallel_group = get_world_group\n"  # an alias: fine
               "_EXPERT_PARALLEL_GROUP = {}\n"
               "_state = {}\n"
               "_CACHE = {}\n"
               "mpu = None\n"
               "if True:\n"
               "    _mesh = make_mesh()\n"
               "def register(unit):\n"
               "    global _unit_parallel\n"
               "    _unit_parallel = unit\n")
    assert group_globals(planted, "planted.py") == [
        "planted.py:3: _EXPERT_PARALLEL_GROUP", "planted.py:4: _state", "planted.py:5: _CACHE",
        "planted.py:6: mpu", "planted.py:8: _mesh", "planted.py:10: _unit_parallel"]
