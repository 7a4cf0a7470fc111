"""Every long import path the docs / HF integration use resolves to the real home."""
import importlib

import pytest

PATHS = [
    ("deepspeed.runtime.config", "DeepSpeedConfig", "deepspeed.config"),
    ("deepspeed.runtime.config_utils", "DeepSpeedConfigModel", "deepspeed.config"),
    ("deepspeed.runtime.engine", "DeepSpeedEngine", "deepspeed.engine"),
    ("deepspeed.runtime.lr_schedules", "WarmupLR", "deepspeed.lr_schedules"),
    ("deepspeed.runtime.lr_schedules", "VALID_LR_SCHEDULES", "deepspeed.lr_schedules"),
    ("deepspeed.runtime.activation_checkpointing.checkpointing", "checkpoint",
     "deepspeed.checkpointing"),
    ("deepspeed.checkpoint.utils", "clone_tensors_for_torch_save", "deepspeed.checkpoint.utils"),
    ("deepspeed.accelerator", "get_accelerator", "deepspeed.accelerator"),
    ("deepspeed.launcher.runner", "main", "deepspeed.launcher.runner"),
    ("deepspeed.launcher.runner", "parse_resource_filter", "deepspeed.launcher.hostfile"),
    # paths code written against upstream imports (issue 36); behaviour in tests/core/compat
    ("deepspeed.runtime.fp16.fused_optimizer", "FP16_Optimizer", "deepspeed.runtime.fp16.fused_optimizer"),
    ("deepspeed.runtime.fp16.loss_scaler", "DynamicLossScaler", "deepspeed.precision"),
    ("deepspeed.runtime.bf16_optimizer", "BF16_Optimizer", "deepspeed.runtime.bf16_optimizer"),
    ("deepspeed.runtime.precision_config", "get_bfloat16_config", "deepspeed.runtime.precision_config"),
    ("deepspeed.runtime.utils", "CheckOverflow", "deepspeed.precision"),
    ("deepspeed.utils", "OnDevice", "deepspeed"),
    # shipped by the zero plugin (plugins/zero/upstream_paths, mapped by setup.py)
    ("deepspeed.utils.zero_to_fp32", "get_fp32_state_dict_from_zero_checkpoint",
     "deepspeed.zero.zero_to_fp32"),
    ("deepspeed.utils.zero_to_fp32", "load_state_dict_from_zero_checkpoint",
     "deepspeed.zero.zero_to_fp32"),
    ("deepspeed.utils.zero_to_fp32", "convert_zero_checkpoint_to_fp32_state_dict",
     "deepspeed.zero.zero_to_fp32"),
    ("deepspeed.checkpoint.ds_to_universal", "main", "deepspeed.zero.ds_to_universal"),
    ("deepspeed.checkpoint.ds_to_universal", "convert", "deepspeed.zero.ds_to_universal"),
    # the ops' documented module paths are their real homes; the API docs also name the top level
    ("deepspeed.ops.transformer", "DeepSpeedTransformerConfig", "deepspeed"),
    ("deepspeed.ops.transformer", "DeepSpeedTransformerLayer", "deepspeed"),
    ("deepspeed.ops.deepspeed4science", "DS4Sci_EvoformerAttention",
     "deepspeed.ops.deepspeed4science.evoformer_attn"),
    # names installed plugins export at the top level (entry-point group deepspeed.exports)
    ("deepspeed", "InferenceEngine", "deepspeed.inference.engine"),
    ("deepspeed.profiling.flops_profiler.profiler", "get_model_profile",
     "deepspeed.profiling.flops_profiler.model_profile"),
    ("deepspeed.runtime.pipe.engine", "PipeSchedule", "deepspeed.runtime.pipe.schedule"),
]


@pytest.mark.parametrize("path,name,home", PATHS)
def test_documented_import_path(path, name, home):
    obj = getattr(importlib.import_module(path), name)
    assert obj is getattr(importlib.import_module(home), name)


def test_top_level_names():
    import deepspeed

    for name in ("initialize", "add_config_arguments", "init_distributed", "DeepSpeedEngine",
                 "DeepSpeedConfig", "get_accelerator", "hookimpl", "__version__", "comm",
                 "DeepSpeedTransformerConfig", "DeepSpeedTransformerLayer"):
        assert getattr(deepspeed, name) is not None, name
    assert "InferenceEngine" in dir(deepspeed)  # a plugin's top-level export is listed too


def test_every_module_is_reachable_as_attributes_after_a_bare_import():
    """Upstream's ``import deepspeed`` imports nearly everything, so scripts and the docs reach
    ``deepspeed.runtime.zero.config.DeepSpeedZeroConfig`` or ``deepspeed.moe.layer.MoE`` by
    attribute access alone (Accelerate reads ``deepspeed.runtime.lr_schedules.
    VALID_LR_SCHEDULES`` that way). Here every package loads its submodules on first attribute
    access (``deepspeed.utils.lazy_exports``): checked for every module the package installs,
    in a fresh interpreter, where nothing imported them first."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    sys.path.insert(0, str(root / "tools" / "docs"))
    from package_tree import package_map

    modules = []
    for package, folder in package_map(root).items():
        if package == "deepspeed.accelerator":
            continue  # the lowest floor sits below deepspeed.utils (test_import_floors.py):
            # its __init__ imports the public names itself
        modules.append(package)
        modules += [f"{package}.{path.stem}" for path in (root / folder).glob("*.py")
                    if path.stem not in ("__init__", "__main__")]
    code = """if True:
        import functools, json, sys
        import deepspeed
        missing = []
        for name in json.loads(sys.argv[1]):
            try:
                functools.reduce(getattr, name.split(".")[1:], deepspeed)
            except AttributeError as err:
                missing.append(f"{name}: {err}")
        print(json.dumps(missing))"""
    out = subprocess.run([sys.executable, "-c", code, json.dumps(sorted(modules))],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []
    assert len(modules) > 300  # the walk found the package
