"""Plugins reach the engine only through ``deepspeed.hooks.Engine``, and read no other package's
private state. Every module under ``plugins/`` is parsed (no code runs) and checked for:

- an engine member the ``Engine`` protocol does not declare (read, written or called);
- a ``getattr`` / ``hasattr`` / ``setattr`` / ``delattr`` / ``vars`` / ``object.__setattr__``
  probe of the engine, or its ``__dict__``: a plugin uses declared members, and adds members
  for its users through ``deepspeed_engine_attributes``;
- in an engine subclass, overriding a member of ``DeepSpeedEngine`` that the protocol does not
  declare (the private ``_clip_gradients`` ...): subclasses change the step through declared
  template methods;
- a private attribute (``_name``) of another package's object.

Which expressions are "the engine", statically: a name ``engine`` or ``ds_engine`` (the profiler's
upstream keyword); ``self.engine``, ``self._engine``, ``self.ds_engine``, ``self.deepspeed``;
a name ``deepspeed`` inside a function that has a parameter of that name (upstream's 1-bit
optimizers take the engine as ``deepspeed=``); and inside a class deriving from
``DeepSpeedEngine`` (or from such a class), ``self`` and ``super()``. The package that defines
an engine subclass (``pipe``) hands it out through ``deepspeed_engine_for_model``, so in that
package an engine may also use what the subclass itself defines.

Whose private attribute ``x._name`` is, statically: ``self`` / ``cls`` / ``super()`` are the
code's own; a module imported from the plugin's own package (or relatively) is its own; one
imported from another ``deepspeed`` package is another package's, allowed only with a reason in
``ALLOWED_DEEPSPEED_PRIVATE``; a third-party module's private (``torch._C...``) needs a reason in
``ALLOWED_THIRD_PARTY_PRIVATE`` (keyed by the dotted path up to that attribute). Any other
object: the name must be defined in the plugin's own package (a ``def``/``class``, a class-level
name, or an assignment ``x._name = ...``), or be a third-party object's documented private
listed with a reason in ``ALLOWED_PRIVATE_NAMES``. (A private name the plugin defines itself is
taken as its own whatever the object: the check cannot know types.)

Docstrings and comments may mention anything. The checker is tested on planted violations, so
an empty result means something.
"""
import ast
from pathlib import Path

import pytest

from deepspeed.hooks import Engine, protocol_members
from test_core_boundary import _imported_roots, _root_name

ROOT = Path(__file__).resolve().parents[2]
PLUGINS = ROOT / "plugins"
BASE_ENGINE = ROOT / "core" / "engine.py"

ENGINE_NAMES = {"engine", "ds_engine"}
ENGINE_SELF_ATTRIBUTES = {"engine", "_engine", "ds_engine", "deepspeed"}
ENGINE_BASES = {"DeepSpeedEngine"}
PROBES = {"getattr", "hasattr", "setattr", "delattr", "vars"}

# another deepspeed package's private, used by a plugin: "module.attribute" -> why
ALLOWED_DEEPSPEED_PRIVATE = {
    f"deepspeed.utils.groups.{name}": (
        "upstream's group getters carry a leading underscore and integrations (Megatron-"
        "DeepSpeed) call them by that name; the topology object of issue 34 replaces them")
    for name in ("_get_expert_parallel_rank", "_get_expert_parallel_group",
                 "_get_expert_data_parallel_rank", "_get_expert_data_parallel_group",
                 "_get_model_parallel_world_size", "_get_model_parallel_group",
                 "_get_data_parallel_world_size", "_create_expert_and_data_parallel",
                 "_get_expert_replica_group", "_get_expert_model_parallel_group",
                 "_get_sequence_parallel_world_size", "_expert_layout")
}

# a third-party module's private, by dotted path -> why
ALLOWED_THIRD_PARTY_PRIVATE = {
    "os._exit": "documented in the os module: leave a forked child without running "
                "the parent's clean-up",
    "sys._getframe": "documented in the sys module: the caller's frame for warnings' stacklevel",
    "torch._foreach_copy_": "torch's multi-tensor copy (what torch.optim's foreach paths use); "
                            "one kernel instead of one per tensor",
    "torch._C._autograd": "the saved-tensors default hooks torch.autograd.graph."
                          "saved_tensors_hooks is built on; read with getattr and a fallback",
    "torch._C._current_graph_task_id": "torch's only way to ask whether autograd's backward is "
                                       "running (torch.utils.checkpoint uses it)",
    "torch.ops.aten._scaled_dot_product_flash_attention_for_cpu": (
        "the aten op behind F.scaled_dot_product_attention on CPU, called for its log-sum-exp"),
    "torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward": (
        "its backward, fed that log-sum-exp"),
    "torch.ops.aten._scaled_dot_product_flash_attention": (
        "the aten op behind F.scaled_dot_product_attention's flash kernel on CUDA, called for "
        "its log-sum-exp"),
    "torch.ops.aten._scaled_dot_product_flash_attention_backward": (
        "its backward, fed that log-sum-exp and the forward's bookkeeping"),
}

# a third-party object's private reached through a local name: attribute -> why
ALLOWED_PRIVATE_NAMES = {
    "_parameters": "torch.nn.Module's parameter registry, which torch.nn.utils and FSDP also "
                   "edit in place; no public API replaces an entry without re-registering it",
    "_buffers": "torch.nn.Module's buffer registry (as _parameters)",
    "_modules": "torch.nn.Module's child registry (as _parameters)",
    "_non_persistent_buffers_set": "torch.nn.Module's record of buffers left out of "
                                   "state_dict, kept consistent when a buffer is replaced",
    "_attn_implementation": "Hugging Face transformers' documented config attribute choosing "
                            "the attention kernel",
    "_cdata": "a torch storage's identity (what torch's own serialization keys storages by)",
    "_replace": "namedtuple's documented method",
    "_asdict": "namedtuple's documented method",
}


# ------------------------------------------------------------------ what each side defines
def _class_members(cls):
    """Names a class body defines: methods, class-level names, ``self.x = ...`` in methods."""
    names = set()
    for node in cls.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                if isinstance(target, ast.Name):
                    names.add(target.id)
    for node in ast.walk(cls):
        if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) \
                and isinstance(node.value, ast.Name) and node.value.id == "self":
            names.add(node.attr)
    return names


def base_engine_members():
    tree = ast.parse(BASE_ENGINE.read_text(encoding="utf-8"))
    [cls] = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "DeepSpeedEngine"]
    return _class_members(cls)


def _is_engine_class(cls, engine_bases):
    return any(ast.unparse(base).split(".")[-1] in engine_bases for base in cls.bases)


def defined_private_names(trees):
    """Private names a package defines: defs, classes, class-level names, ``x._n = ...``."""
    names = set()
    for tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                names.add(node.attr)
            if isinstance(node, ast.ClassDef):
                names |= _class_members(node)
    return {name for name in names if name.startswith("_")}


class Package:
    """What the checker knows of one plugin package (its folder name and parsed modules)."""

    def __init__(self, name, trees, engine_bases=frozenset(ENGINE_BASES)):
        self.name = name
        self.private_names = defined_private_names(trees)
        self.engine_bases = set(engine_bases)
        self.engine_members = set()  # what this package's engine subclasses define
        for tree in trees:
            for cls in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)):
                if _is_engine_class(cls, self.engine_bases):
                    self.engine_bases.add(cls.name)
                    self.engine_members |= _class_members(cls)


# ------------------------------------------------------------------ the check
def violations(source, relpath, package, declared, base_members):
    """Every boundary violation in one plugin module, as ``"path:line: what"``."""
    tree = ast.parse(source)
    roots = _imported_roots(tree)
    relative = {alias.asname or alias.name for node in ast.walk(tree)
                if isinstance(node, ast.ImportFrom) and node.level for alias in node.names}
    own_prefix = f"deepspeed.{package.name}"
    undeclared_base = base_members - declared
    subclass_own = package.engine_members - base_members
    parents = {id(child): node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    found = []

    def report(node, what):
        found.append(f"{relpath}:{node.lineno}: {what}")

    def scope_of(node):
        """(enclosing engine class or None, parameter names of every enclosing function)."""
        engine_class, params = None, set()
        while id(node) in parents:
            node = parents[id(node)]
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                args = node.args
                params |= {a.arg for a in args.posonlyargs + args.args + args.kwonlyargs}
            elif isinstance(node, ast.ClassDef) and engine_class is None \
                    and _is_engine_class(node, package.engine_bases):
                engine_class = node
        return engine_class, params

    def is_engine(node):
        if isinstance(node, ast.Name):
            if node.id in ENGINE_NAMES:
                return True
            engine_class, params = scope_of(node)
            return (node.id == "deepspeed" and "deepspeed" in params) or \
                (node.id == "self" and engine_class is not None)
        if isinstance(node, ast.Attribute):
            return (node.attr in ENGINE_SELF_ATTRIBUTES and isinstance(node.value, ast.Name)
                    and node.value.id == "self")
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
                and node.func.id == "super":
            return scope_of(node)[0] is not None
        return False

    def check_engine_member(node):
        name = node.attr
        if name == "__dict__":
            report(node, f"probes the engine through {ast.unparse(node)}")
        elif name.startswith("__") or name in declared or name in subclass_own:
            return
        else:
            report(node, f"uses engine member {ast.unparse(node)}, which deepspeed.hooks.Engine "
                         f"does not declare")

    def check_private(node):
        owner = node.value
        if isinstance(owner, ast.Name) and owner.id in ("self", "cls"):
            return
        if isinstance(owner, ast.Call) and isinstance(owner.func, ast.Name) \
                and owner.func.id == "super":
            return
        parent = parents.get(id(node))
        if isinstance(parent, ast.Attribute) and parent.attr.startswith("_") \
                and not parent.attr.startswith("__") and parent.value is node:
            return  # the outermost private of a chain is the one judged
        root = _root_name(owner)
        dotted = ast.unparse(node)
        if root in relative:
            return
        if root in roots:
            source_module = roots[root]
            full = source_module + dotted[len(root):]
            if source_module == own_prefix or source_module.startswith(own_prefix + "."):
                return
            if source_module.startswith("deepspeed"):
                if full not in ALLOWED_DEEPSPEED_PRIVATE:
                    report(node, f"reads another package's private attribute {dotted} ({full})")
            elif dotted not in ALLOWED_THIRD_PARTY_PRIVATE and full not in \
                    ALLOWED_THIRD_PARTY_PRIVATE:
                report(node, f"reads the third-party private {dotted} with no reason listed in "
                             f"ALLOWED_THIRD_PARTY_PRIVATE")
            return
        if node.attr in package.private_names or node.attr in ALLOWED_PRIVATE_NAMES:
            return
        report(node, f"reads private attribute {dotted}, which package '{package.name}' does "
                     f"not define (another package's object, or a third-party private needing "
                     f"a reason in ALLOWED_PRIVATE_NAMES)")

    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            if is_engine(node.value):
                check_engine_member(node)
            elif node.attr.startswith("_") and not node.attr.startswith("__"):
                check_private(node)
        elif isinstance(node, ast.Call) and node.args and is_engine(node.args[0]):
            func = ast.unparse(node.func)
            if func in PROBES or func == "object.__setattr__":
                report(node, f"probes the engine with {func}(); use the members "
                             f"deepspeed.hooks.Engine declares (deepspeed_engine_attributes to "
                             f"add one for users)")
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) \
                and node.name in undeclared_base and not node.name.startswith("__"):
            engine_class, _ = scope_of(node)
            if engine_class is not None and node in engine_class.body:
                report(node, f"{engine_class.name} overrides DeepSpeedEngine.{node.name}, which "
                             f"deepspeed.hooks.Engine does not declare")
    return found


def plugin_packages():
    """``{folder name: [(relative path, source, tree)]}`` of every plugin package."""
    packages = {}
    for folder in sorted(p for p in PLUGINS.iterdir() if (p / "__init__.py").is_file()):
        modules = []
        for path in sorted(folder.rglob("*.py")):
            source = path.read_text(encoding="utf-8")
            modules.append((path.relative_to(PLUGINS).as_posix(), source, ast.parse(source)))
        packages[folder.name] = modules
    return packages


def test_plugins_use_only_the_declared_engine_and_their_own_privates():
    declared = set(protocol_members(Engine))
    base = base_engine_members()
    assert {"module", "config", "hook"} <= declared and "_clip_gradients" in base  # live
    packages = plugin_packages()
    assert len(packages) >= 16 and "pipe" in packages
    found = []
    for name, modules in packages.items():
        package = Package(name, [tree for _, _, tree in modules])
        for relpath, source, _ in modules:
            found += violations(source, relpath, package, declared, base)
    assert not found, "plugins cross the engine contract:\n" + "\n".join(found)


def test_every_allowed_private_gives_a_reason():
    for table in (ALLOWED_DEEPSPEED_PRIVATE, ALLOWED_THIRD_PARTY_PRIVATE, ALLOWED_PRIVATE_NAMES):
        assert all(isinstance(why, str) and len(why) > 20 for why in table.values())


# ------------------------------------------------------------------ the checker on planted code
BASE = {"module", "config", "step", "_clip_gradients", "_global_grad_norm", "throughput"}
DECLARED = {"module", "config", "step"}
OWN = """
class _Helper:
    def _own(self):
        self._state = 1

class PipeLikeEngine(DeepSpeedEngine):
    stages = 2

    def own_method(self):
        self._private_of_mine = 1
"""


def _check(planted, package="demo"):
    source = f'"""a docstring may say engine._secret"""\nimport torch\n{planted}\n'
    pkg = Package(package, [ast.parse(OWN)])
    return violations(source, "planted.py", pkg, DECLARED, BASE)


@pytest.mark.parametrize("planted,expected", [
    ("x = engine.throughput", "engine member engine.throughput"),
    ("engine.secret = 1", "engine member engine.secret"),
    ("def f(self):\n    return self.engine._global_grad_norm", "self.engine._global_grad_norm"),
    ("def f(self):\n    return self._engine.optimizer", "self._engine.optimizer"),
    ("n = ds_engine.mpu", "ds_engine.mpu"),
    ("def f(params, deepspeed=None):\n    deepspeed.flag = False", "deepspeed.flag"),
    ("o = getattr(engine, 'optimizer', None)", "probes the engine with getattr()"),
    ("ok = hasattr(engine, 'mpu')", "probes the engine with hasattr()"),
    ("object.__setattr__(engine, 'extra', 1)", "probes the engine with object.__setattr__()"),
    ("d = engine.__dict__", "probes the engine through engine.__dict__"),
    ("class E(DeepSpeedEngine):\n    def _clip_gradients(self):\n        pass",
     "E overrides DeepSpeedEngine._clip_gradients"),
    ("class E(DeepSpeedEngine):\n    def f(self):\n        self._global_grad_norm = 1",
     "engine member self._global_grad_norm"),
    ("class E(DeepSpeedEngine):\n    def f(self):\n        return super().throughput",
     "engine member super().throughput"),
    ("from deepspeed.utils import groups\ng = groups._secret_group()",
     "another package's private attribute groups._secret_group"),
    ("f = torch._C._secret", "third-party private torch._C._secret"),
    ("v = layer._not_defined_here", "private attribute layer._not_defined_here"),
])
def test_the_checker_catches_planted_violations(planted, expected):
    found = _check(planted)
    assert len(found) == 1 and expected in found[0], found


def test_the_checker_allows_declared_members_own_privates_and_listed_reasons():
    planted = """
from deepspeed.demo import helpers
from . import sibling
from deepspeed.utils import groups

def hook(engine):
    engine.module.train()
    engine.config.section("x")
    engine.stages  # the package's own engine subclass
    engine._private_of_mine
    helpers._anything()
    sibling._anything()
    groups._get_expert_parallel_group()
    torch._foreach_copy_
    torch._C._current_graph_task_id()
    helper = _Helper()
    helper._own()
    helper._state
    module._parameters
    getattr(module, "x", None)

def not_an_engine(x):
    deepspeed = x
    return deepspeed.anything

class E(PipeLikeEngine):
    def step(self):
        return super().step() + self.stages + self.__class__.__name__
"""
    assert _check(planted) == []
