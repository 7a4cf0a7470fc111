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


def test_runtime_submodules_reachable_as_attributes():
    """Accelerate reads ``deepspeed.runtime.lr_schedules.VALID_LR_SCHEDULES`` after a bare
    ``import deepspeed``: checked in a fresh interpreter, where nothing imported it first."""
    import subprocess
    import sys

    code = ("import deepspeed; print(len(deepspeed.runtime.lr_schedules.VALID_LR_SCHEDULES), "
            "deepspeed.runtime.engine.DeepSpeedEngine.__name__)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split()[1] == "DeepSpeedEngine"
