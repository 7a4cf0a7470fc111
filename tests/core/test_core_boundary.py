"""The core knows no plugin: every module under ``core/`` is parsed and checked for

- imports of a plugin's package (``deepspeed.zero``, ``deepspeed.runtime.zero``, ...);
- a plugin's config section named in code (``"zero_optimization"``, ``"tensorboard"``, ...):
  the core reads settings only through the section models the plugins register;
- ZeRO's parameter attributes (``ds_status``, ``ds_tensor``, ...);
- another object's private attributes (``engine.precision._pairs``, ``accelerator._name``):
  what crosses the boundary is declared in ``deepspeed.hooks``;
- a feature's concepts in identifiers and strings: experts (MoE), tensor parallelism, pipeline
  stages, ZeRO-3 leaf modules (``FEATURE_CONCEPTS``): their code and names live in the plugin,
  the core asks the topology or a hook;
- a plugin's package named in a string (``"deepspeed.autotuning"``: a launcher or error message
  that knows which plugin does what), and ZeRO's top-level keys (``zero_allow_untested_optimizer``)
  as strings or attributes.

Docstrings and comments may mention anything. Each exception below carries its reason; the
checker itself is tested on planted violations, so an empty result means something.
"""
import ast
import builtins
import re
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
        "MonitorMaster(ds_config.monitor_config)); it returns those sections' models as attributes"),
    "launcher/plugin_commands.py": (
        {"autotuning"}, "the table of documented launcher flags names the feature each runs, so "
                        "a flag whose plugin is missing gets a clear message"),
    "comm/observers.py": (
        {"comms_logger"}, "deepspeed.comm.configure(deepspeed_config=...) is documented to "
                          "read the comms_logger section itself (the core owns deepspeed.comm)"),
}

# A feature's concept, found in the words of an identifier or string (split at ``_``, ``.``,
# case changes and other punctuation, lower-cased, joined by ``_``).
FEATURE_CONCEPTS = {
    "expert (MoE)": r"(^|_)(experts?|moe)(_|$)",
    "tensor parallelism": r"tensor_(model_)?parallel|(^|_)(tp|autotp)(_|$)|(column|row)_parallel",
    "pipeline stages": r"(^|_)pipe(line)?(_|$)|stage_id|num_stages",
    "ZeRO-3 leaf modules": r"leaf_modules?|z3_leaf",
}
ZERO_KEYS = {"zero_allow_untested_optimizer", "zero_force_ds_cpu_optimizer"}
BUILTINS = set(dir(builtins))  # BrokenPipeError is no pipeline

# core file (relative to core/) -> ({the identifiers / strings it may hold}, why)
ALLOWED_CONCEPTS = {
    "api.py": ({"tp_model_init", "tp_size", "TP_MODEL_INIT_SECTION", "deepspeed_tp_model_init"},
               "deepspeed.tp_model_init(model, tp_size, ...) is a documented top-level entry "
               "point (Transformers calls it); the core only forwards it to the plugin answering "
               "deepspeed_tp_model_init"),
    "__init__.py": ({"tp_model_init"}, "the lazy table of that top-level entry point"),
    "hooks.py": ({"deepspeed_tp_model_init", "tp_size", "ds_pipe_replicated"},
                 "the hook contract names the hook of that entry point and, as the value of "
                 "REPLICATED_PARAM, upstream's attribute name a plugin sets"),
    "config/feature_sections.py": (
        {"TP_MODEL_INIT_SECTION", "tensor_parallel", "AutoTP tensor-parallel training",
         "pipeline", "pipeline parallelism"},
        "the table of documented feature sections (so a missing plugin is named); the core "
        "validates none of them"),
    "config/config.py": ({"checkpoint_parallel_write_pipeline",
                          "checkpoint.parallel_write.pipeline_stage"},
                         "checkpoint.parallel_write.pipeline_stage is a documented core key; "
                         "upstream's DeepSpeedConfig attribute reads it"),
    "config/core_sections.py": ({"pipeline_stage", "parallel_write.pipeline_stage",
                                 "a pipeline's checkpoint is written as before: the first "
                                 "data-parallel rank of each stage writes all of the stage's "
                                 "layer files"},
                                "the documented core key above, and why it has no effect"),
    "activation_checkpointing/settings.py": (
        {"get_tensor_model_parallel_rank", "get_tensor_model_parallel_world_size",
         "get_tensor_model_parallel_group"},
        "deepspeed.checkpointing.configure(mpu_) takes a Megatron mpu, whose interface spells "
        "the group activations are partitioned over get_tensor_model_parallel_*"),
    "precision/overflow.py": ({"has_moe_params"},
                              "upstream's CheckOverflow.has_overflow(params, has_moe_params) "
                              "signature; the flag only widens the check to every rank"),
    "testing/distributed.py": ({"Pipe"}, "multiprocessing's Pipe: how the test pool talks to its "
                                         "ranks"),
}


def _words(text):
    """``text`` split into lower-case words joined by ``_`` (``TP_MODEL_INIT`` ->
    ``tp_model_init``, ``PipelineModule`` -> ``pipeline_module``)."""
    return "_".join(word.lower() for word in re.findall(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|[0-9]+",
                                                        text))


def feature_concept(text):
    """The feature concept ``text`` names, or None."""
    words = _words(text)
    for concept, pattern in FEATURE_CONCEPTS.items():
        if re.search(pattern, words):
            return concept
    return None


def _concept_allowed(relpath, text):
    allowed, _why = ALLOWED_CONCEPTS.get(relpath, ((), ""))
    return text in allowed


def _names_plugin_package(text, packages):
    return any(re.search(rf"(^|[^\w.]){re.escape(package)}(\.|\b)", text) for package in packages)


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
            elif text.startswith("zero_optimization") or text in ZERO_KEYS:
                report(node, f"names ZeRO's config key {text!r}")
            elif text in ZERO_ATTRIBUTES:
                report(node, f"names ZeRO's parameter attribute {text!r}")
            elif _names_plugin_package(text, packages):
                report(node, f"names a plugin package in the string {text[:60]!r}")
            elif feature_concept(text) and not _concept_allowed(relpath, text):
                report(node, f"names {feature_concept(text)} in the string {text[:60]!r}")
        elif isinstance(node, (ast.Name, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef,
                               ast.arg)):
            name = getattr(node, "id", None) or getattr(node, "name", None) or node.arg
            external = (name in roots and not roots[name].startswith("deepspeed")) \
                or name in BUILTINS
            if feature_concept(name) and not external and not _concept_allowed(relpath, name):
                report(node, f"names {feature_concept(name)} in the identifier {name}")
        elif isinstance(node, ast.Attribute):
            root = _root_name(node.value)
            external = root in roots and not roots[root].startswith("deepspeed")
            if node.attr in ZERO_ATTRIBUTES:
                report(node, f"reads ZeRO's parameter attribute .{node.attr}")
            elif node.attr in ZERO_KEYS:
                report(node, f"reads ZeRO's config key .{node.attr}")
            elif feature_concept(node.attr) and not external \
                    and not _concept_allowed(relpath, node.attr):
                report(node, f"names {feature_concept(node.attr)} in the attribute .{node.attr}")
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
    ("n = layer.num_experts", "names expert (MoE) in the attribute .num_experts"),
    ("def _create_expert_and_data_parallel(ep_size):\n    pass",
     "names expert (MoE) in the identifier _create_expert_and_data_parallel"),
    ("group = groups.get_tensor_model_parallel_group()",
     "names tensor parallelism in the attribute .get_tensor_model_parallel_group"),
    ("TP_SIZE = 2", "names tensor parallelism in the identifier TP_SIZE"),
    ("sid = grid.stage_id", "names pipeline stages in the attribute .stage_id"),
    ("msg = 'the pipeline engine'", "names pipeline stages in the string"),
    ("set_z3_leaf_modules(model, [Block])",
     "names ZeRO-3 leaf modules in the identifier set_z3_leaf_modules"),
    ("x = config['zero_allow_untested_optimizer']", "names ZeRO's config key"),
    ("ok = config.zero_force_ds_cpu_optimizer",
     "reads ZeRO's config key .zero_force_ds_cpu_optimizer"),
    ("m = importlib.import_module('deepspeed.zero.stage3')",
     "names a plugin package in the string"),
    ("FLAGS = {'--x': 'deepspeed.zero'}", "names a plugin package in the string"),
])
def test_the_checker_catches_planted_violations(planted, expected):
    source = (f'"""a docstring may say zero_optimization, ds_tensor, experts, the pipeline, '
              f'deepspeed.zero and tensor_model_parallel"""\n{planted}\n')
    found = violations(source, "planted.py", {"deepspeed.zero", "deepspeed.runtime.zero"},
                       {"zero_optimization"})
    assert len(found) == 1 and expected in found[0], found


def test_the_checker_allows_external_names_and_listed_exceptions():
    """Names from outside deepspeed (multiprocessing's Pipe, a builtin) are not features; an
    allowed file may hold its listed names."""
    source = ("import subprocess\n"
              "from multiprocessing import Pipe\n"
              "a, b = Pipe()\n"
              "out = subprocess.PIPE\n"
              "except_type = BrokenPipeError\n")
    assert violations(source, "ok.py", {"deepspeed.zero"}, {"zero_optimization"}) == []
    assert violations("tp_model_init = 1\n", "api.py", set(), set()) == []
    assert violations("tp_model_init = 1\n", "engine.py", set(), set()) != []


def test_the_checker_allows_own_and_third_party_private_names():
    source = ("import torch\n"
              "class A:\n"
              "    def f(self):\n"
              "        return self._x + super()._y() + torch._foreach_add\n")
    assert violations(source, "ok.py", {"deepspeed.zero"}, {"zero_optimization"}) == []
