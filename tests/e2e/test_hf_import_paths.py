"""The `deepspeed` import paths and engine members that transformers/accelerate use.

Hugging Face code imports most of these lazily inside functions, so a missing path only shows up
deep inside a training run. These tests pin every path listed as present in
docs/dev/hf_integration_inventory.md so that a refactor cannot silently drop one.
"""
import ast
import importlib
import inspect
import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("transformers", reason="transformers is not installed (test extra 'hf')")
pytest.importorskip("accelerate", reason="accelerate is not installed (test extra 'hf')")

# (module, name) pairs imported by transformers / accelerate (see the inventory doc for where).
IMPORT_PATHS = [
    ("deepspeed", "__version__"),
    ("deepspeed", "initialize"),
    ("deepspeed", "DeepSpeedEngine"),
    ("deepspeed", "comm"),
    ("deepspeed", "zero"),
    ("deepspeed.comm", "is_initialized"),
    ("deepspeed.comm", "init_distributed"),
    ("deepspeed.comm", "get_rank"),
    ("deepspeed.accelerator", "get_accelerator"),
    ("deepspeed.utils", "logger"),
    ("deepspeed.zero", "GatheredParameters"),
    ("deepspeed.zero", "Init"),
    ("deepspeed.zero", "register_external_parameter"),
    ("deepspeed.runtime.engine", "DeepSpeedEngine"),
    ("deepspeed.runtime.lr_schedules", "VALID_LR_SCHEDULES"),
    ("deepspeed.checkpoint.utils", "clone_tensors_for_torch_save"),
    ("deepspeed.ops.adam", "DeepSpeedCPUAdam"),
    ("deepspeed.ops.adagrad", "DeepSpeedCPUAdagrad"),
    ("deepspeed.ops.lion", "DeepSpeedCPULion"),
    ("deepspeed.utils", "groups"),
    ("deepspeed.utils", "set_z3_leaf_modules"),
    ("deepspeed.utils", "is_initialized"),
    ("deepspeed.runtime.utils", "move_to_device"),
    ("deepspeed", "tp_model_init"),
    ("deepspeed.runtime.zero", "GatheredParameters"),  # named in an Accelerate docstring
]

# Names HF reaches through a module it imported from us (not visible as `deepspeed.` chains).
SECOND_HOP = [
    ("deepspeed.utils.groups", "_get_sequence_parallel_group"),
    ("deepspeed.utils.groups", "_get_sequence_parallel_world_size"),
    ("deepspeed.utils.groups", "_get_sequence_parallel_rank"),
    ("deepspeed.runtime.zero.partition_parameters", "zero_wrapper_for_fp_tensor_constructor"),
    ("deepspeed.runtime.zero.partition_parameters", "_orig_torch_arange"),
]

# Chains HF reaches with only `import deepspeed` done (no import of the submodule itself).
BARE_IMPORT_CHAINS = [
    "initialize",
    "comm.get_rank",
    "zero.GatheredParameters",
    "zero.Init",
    "zero.register_external_parameter",
]

# Engine methods HF calls, with the keyword arguments it passes.
ENGINE_METHODS = {
    "backward": [],
    "step": [],
    "set_gradient_accumulation_boundary": ["is_boundary"],
    "get_global_grad_norm": [],
    "save_checkpoint": ["exclude_frozen_parameters"],
    "load_checkpoint": ["load_module_strict", "load_optimizer_states", "load_lr_scheduler_states"],
    "destroy": [],
    "compile": [],
    "save_16bit_model": [],
    "zero_optimization_stage": [],
    "gradient_accumulation_steps": [],
    "train": [],
    "eval": [],
    "state_dict": [],
}


@pytest.mark.parametrize("module,name", IMPORT_PATHS + SECOND_HOP,
                         ids=[f"{m}:{n}" for m, n in IMPORT_PATHS + SECOND_HOP])
def test_import_path_exists(module, name):
    mod = importlib.import_module(module)
    assert hasattr(mod, name), f"{module} has no attribute {name!r} (used by transformers/accelerate)"


def _run_program(code, folder, timeout, args=()):
    """``code`` run as a script: a new program that has not imported deepspeed (under the suite's
    warm interpreters, a fork that imported torch only; ``-c`` would start a cold one)."""
    script = folder / "program.py"
    script.write_text(code)
    return subprocess.run([sys.executable, str(script), *args], capture_output=True,
                          text=True, timeout=timeout)


def test_attribute_chains_reachable_after_bare_import(tmp_path):
    """HF writes `import deepspeed; deepspeed.zero.X(...)`: the chain must resolve without an
    explicit submodule import, which only a new interpreter can show."""
    code = (
        "import deepspeed\n"
        f"missing = []\n"
        f"for chain in {BARE_IMPORT_CHAINS!r}:\n"
        "    obj = deepspeed\n"
        "    try:\n"
        "        for part in chain.split('.'):\n"
        "            obj = getattr(obj, part)\n"
        "    except AttributeError:\n"
        "        missing.append(chain)\n"
        "print(','.join(missing))\n"
    )
    out = _run_program(code, tmp_path, timeout=120)
    assert out.returncode == 0, out.stderr
    missing = out.stdout.strip().splitlines()[-1] if out.stdout.strip() else ""
    assert missing == "", f"not reachable after bare `import deepspeed`: {missing}"


@pytest.mark.parametrize("method", sorted(ENGINE_METHODS))
def test_engine_method_accepts_hf_keywords(method):
    from deepspeed import DeepSpeedEngine

    fn = getattr(DeepSpeedEngine, method, None)
    assert callable(fn), f"DeepSpeedEngine.{method} is missing (called by transformers/accelerate)"
    params = inspect.signature(fn).parameters
    takes_var_kw = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    for kw in ENGINE_METHODS[method]:
        assert kw in params or takes_var_kw, f"DeepSpeedEngine.{method} does not accept {kw}="


def test_engine_module_and_runtime_engine_are_the_same_class():
    import deepspeed
    from deepspeed.runtime.engine import DeepSpeedEngine

    assert deepspeed.DeepSpeedEngine is DeepSpeedEngine


def test_hf_integration_sees_deepspeed():
    from accelerate.utils import is_deepspeed_available as accelerate_available
    from transformers.integrations.deepspeed import HfDeepSpeedConfig
    from transformers.integrations.deepspeed import is_deepspeed_available as hf_available

    assert hf_available() is True
    assert accelerate_available() is True
    cfg = HfDeepSpeedConfig({"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 3}})
    assert cfg.is_zero3()


def _deepspeed_references(package):
    """Every ``from deepspeed... import X``, ``import deepspeed...`` and ``deepspeed.a.b``
    attribute chain in the installed ``package``'s source, with the first file using it."""
    root = os.path.dirname(importlib.import_module(package).__file__)
    found = {}
    for dirpath, _, files in os.walk(root):
        for name in files:
            path = os.path.join(dirpath, name)
            if not name.endswith(".py"):
                continue
            with open(path, encoding="utf-8") as handle:
                text = handle.read()
            if "deepspeed" not in text:
                continue
            where = os.path.relpath(path, os.path.dirname(root))
            for node in ast.walk(ast.parse(text)):
                if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and \
                        node.module.split(".")[0] == "deepspeed":
                    for alias in node.names:
                        found.setdefault(f"{node.module}:{alias.name}", where)
                elif isinstance(node, ast.Import):
                    for alias in node.names:
                        if alias.name.split(".")[0] == "deepspeed":
                            found.setdefault(f"{alias.name}:", where)
                elif isinstance(node, ast.Attribute):
                    chain, value = [], node
                    while isinstance(value, ast.Attribute):
                        chain.append(value.attr)
                        value = value.value
                    if isinstance(value, ast.Name) and value.id == "deepspeed":
                        found.setdefault("deepspeed." + ".".join(reversed(chain)), where)
    return found


# Run in a new program: a chain must resolve after nothing but `import deepspeed`, and a
# `from m import X` may name a submodule of m as well as an attribute.
_RESOLVE = """
import importlib, json, sys
import deepspeed
missing = []
for ref in json.loads(sys.argv[1]):
    try:
        if ":" in ref:
            module, name = ref.split(":")
            mod = importlib.import_module(module)
            if name and not hasattr(mod, name):
                importlib.import_module(module + "." + name)
        else:
            obj = deepspeed
            for part in ref.split(".")[1:]:
                obj = getattr(obj, part)
    except (ImportError, AttributeError) as exc:
        missing.append(f"{ref} ({type(exc).__name__}: {exc})")
print(json.dumps(missing))
"""


def test_every_deepspeed_path_the_installed_hf_releases_use_resolves(tmp_path):
    """Found by reading the installed transformers and accelerate sources, so an upgrade that
    starts using a new path fails here instead of deep inside someone's training run."""
    found = {}
    for package in ("transformers", "accelerate"):
        found.update(_deepspeed_references(package))
    # the paths the integration is known to use must be among those found (the scan works)
    assert "deepspeed.zero.GatheredParameters" in found
    assert "deepspeed.runtime.lr_schedules:VALID_LR_SCHEDULES" not in found  # an attribute chain
    assert "deepspeed.utils:groups" in found
    out = _run_program(_RESOLVE, tmp_path, timeout=300, args=[json.dumps(sorted(found))])
    assert out.returncode == 0, out.stderr
    missing = json.loads(out.stdout.strip().splitlines()[-1])
    assert missing == [], "\n".join(f"{m}  used in {found[m.split(' ')[0]]}" for m in missing)
