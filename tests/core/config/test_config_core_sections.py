"""Core config keys: defaults, accepted spellings, cross-section rules and path-named errors."""
import pytest

from deepspeed.config import ConfigDeprecationWarning, DeepSpeedConfig, DeepSpeedConfigError

BASE = {"train_batch_size": 8}


def build(**extra):
    return DeepSpeedConfig(dict(BASE, **extra), world_size=1)


def error_of(config, world_size=1, **kwargs):
    with pytest.raises(DeepSpeedConfigError) as info:
        DeepSpeedConfig(config, world_size=world_size, **kwargs)
    return str(info.value)


def test_documented_defaults():
    config = build()
    fp16 = config.core.fp16
    assert (fp16.enabled, fp16.auto_cast, fp16.loss_scale, fp16.initial_scale_power,
            fp16.loss_scale_window, fp16.hysteresis, fp16.consecutive_hysteresis,
            fp16.min_loss_scale, fp16.fp16_master_weights_and_grads) == (
        False, False, 0, 16, 1000, 2, False, 1, False)
    assert config.core.fp16.dynamic_loss_scale and config.initial_dynamic_scale == 2.0 ** 16
    assert config.gradient_clipping == 0.0  # docs silent; 0 = no clipping (see core_sections.py)
    assert config.steps_per_print == 10
    assert not config.wall_clock_breakdown and not config.dump_state and not config.memory_breakdown
    assert not config.prescale_gradients and config.gradient_predivide_factor == 1.0
    assert not config.sparse_gradients_enabled and config.communication_data_type is None
    assert not config.bfloat16_enabled and not config.amp_enabled
    assert config.optimizer_name is None and config.scheduler_name is None
    assert config.checkpoint_tag_validation_enabled and not config.checkpoint_tag_validation_fail
    assert not config.load_universal_checkpoint and not config.use_node_local_storage
    assert not config.checkpoint_parallel_write_pipeline
    assert config.grad_accum_dtype is None and not config.dataloader_drop_last
    assert config.activation_checkpointing_config.number_checkpoints is None


def test_fp16_loss_scaler_args():
    config = build(fp16={"enabled": True, "loss_scale": 0, "initial_scale_power": 8,
                         "loss_scale_window": 3, "hysteresis": 2, "min_loss_scale": 0.5})
    assert config.fp16_enabled
    assert config.dynamic_loss_scale_args == {"init_scale": 256.0, "scale_window": 3, "delayed_shift": 2,
                                              "consecutive_hysteresis": False, "min_scale": 0.5}
    assert not build(fp16={"enabled": True, "loss_scale": 128}).core.fp16.dynamic_loss_scale


@pytest.mark.parametrize("given, resolved", [("fp16", "fp16"), ("fp32", "fp32"), ("bf16", "bf16"),
                                             ("bfp16", "bf16"), (None, None)])
def test_communication_data_type_spellings(given, resolved):
    assert build(communication_data_type=given).communication_data_type == resolved


def test_communication_data_type_invalid():
    message = error_of(dict(BASE, communication_data_type="fp8"))
    assert "communication_data_type: Invalid communication_data_type. Supported data types: " in message
    assert "'fp8'" in message


def test_bfloat16_is_the_old_name_of_bf16():
    with pytest.warns(ConfigDeprecationWarning, match="'bfloat16' is deprecated; use 'bf16'"):
        config = build(bfloat16={"enabled": True, "immediate_grad_update": True})
    assert config.bfloat16_enabled and config.bfloat16_immediate_grad_update
    assert config.has_section("bf16") and config.section("bfloat16") is config.section("bf16")
    assert "bfloat16" not in config.to_dict() and config.to_dict()["bf16"]["enabled"] is True


def test_bfloat16_and_bf16_together():
    message = error_of(dict(BASE, bfloat16={"enabled": True}, bf16={"enabled": True}))
    assert "Cannot provide deprecated parameter 'bfloat16' and replacing parameter 'bf16' together" in message


@pytest.mark.parametrize("sections, names", [
    ({"fp16": {"enabled": True}, "bf16": {"enabled": True}}, "fp16 and bf16"),
    ({"amp": {"enabled": True}, "fp16": {"enabled": True}}, "fp16 and amp"),
    ({"amp": {"enabled": True}, "bf16": {"enabled": True}}, "bf16 and amp"),
])
def test_one_mixed_precision_mode_only(sections, names):
    assert f"{names} cannot be enabled at once" in error_of(dict(BASE, **sections))


def test_disabled_modes_do_not_conflict():
    config = build(fp16={"enabled": False}, bf16={"enabled": True}, amp={"enabled": False})
    assert config.bfloat16_enabled and not config.fp16_enabled


def test_amp_passes_apex_keys_through():
    config = build(amp={"enabled": True, "opt_level": "O1", "keep_batchnorm_fp32": False, "loss_scale": "dynamic"})
    assert config.amp_params == {"opt_level": "O1", "keep_batchnorm_fp32": False, "loss_scale": "dynamic"}
    assert "amp.opt_levle: unknown key; did you mean 'amp.opt_level'?" in error_of(
        dict(BASE, amp={"enabled": True, "opt_levle": "O1"}))


def test_optimizer_and_scheduler():
    config = build(optimizer={"type": "AdamW", "params": {"lr": 1e-3, "betas": [0.9, 0.999], "eps": 1e-8}},
                   scheduler={"type": "WarmupLR", "params": {"warmup_num_steps": 10}})
    assert config.optimizer_name == "AdamW" and config.optimizer_params["betas"] == [0.9, 0.999]
    assert config.scheduler_name == "WarmupLR" and config.scheduler_params == {"warmup_num_steps": 10}
    assert build(optimizer={"type": "SGD"}).optimizer_params == {}
    assert "optimizer.type: required key is missing" in error_of(dict(BASE, optimizer={"params": {}}))


@pytest.mark.parametrize("mode, enabled, fail", [("Ignore", False, False), ("warn", True, False),
                                                 ("FAIL", True, True)])
def test_checkpoint_tag_validation_modes(mode, enabled, fail):
    config = build(checkpoint={"tag_validation": mode, "load_universal": True, "use_node_local_storage": True,
                               "parallel_write": {"pipeline_stage": True}})
    assert config.checkpoint_tag_validation_enabled is enabled
    assert config.checkpoint_tag_validation_fail is fail
    assert config.load_universal_checkpoint and config.use_node_local_storage
    assert config.checkpoint_parallel_write_pipeline


def test_checkpoint_tag_validation_invalid():
    message = error_of(dict(BASE, checkpoint={"tag_validation": "sometimes"}))
    assert "checkpoint.tag_validation: Input should be 'Ignore', 'Warn' or 'Fail'" in message


def test_data_types_and_activation_checkpointing():
    config = build(data_types={"grad_accum_dtype": "fp32"},
                   activation_checkpointing={"partition_activations": True, "cpu_checkpointing": True,
                                             "contiguous_memory_optimization": True, "number_checkpoints": 4,
                                             "synchronize_checkpoint_boundary": True, "profile": True})
    assert config.grad_accum_dtype == "fp32"
    assert config.activation_checkpointing_config.number_checkpoints == 4
    assert "data_types.grad_accum_dtype" in error_of(dict(BASE, data_types={"grad_accum_dtype": "int8"}))


def test_typo_inside_a_section_names_path_and_suggestion():
    message = error_of(dict(BASE, fp16={"enabled": True, "initial_scale_powr": 12}))
    assert "fp16.initial_scale_powr: unknown key; did you mean 'fp16.initial_scale_power'?" in message


def test_typo_in_a_nested_section():
    message = error_of(dict(BASE, checkpoint={"parallel_write": {"pipeline_stag": True}}))
    assert ("checkpoint.parallel_write.pipeline_stag: unknown key; "
            "did you mean 'checkpoint.parallel_write.pipeline_stage'?") in message


def test_typo_at_top_level():
    message = error_of({"trian_batch_size": 8, "train_micro_batch_size_per_gpu": 1})
    assert "trian_batch_size: unknown key; did you mean 'train_batch_size'?" in message


def test_unknown_key_without_close_match_lists_allowed_keys():
    message = error_of(dict(BASE, fp16={"xyzzy": 1}))
    assert "fp16.xyzzy: unknown key; keys allowed here: auto_cast, consecutive_hysteresis, enabled" in message


def test_every_problem_is_reported_at_once():
    message = error_of({"train_batch_size": 8.5, "gradient_clipping": -1, "steps_per_prnt": 5,
                        "fp16": {"hysteresis": 0}, "optimizer": {"type": "Adam", "params": []}})
    assert "5 problems" in message
    for fragment in ["train_batch_size: Input should be a valid integer, got a number with a fractional part",
                     "gradient_clipping: Input should be greater than or equal to 0 (got -1)",
                     "steps_per_prnt: unknown key; did you mean 'steps_per_print'?",
                     "fp16.hysteresis: Input should be greater than or equal to 1",
                     "optimizer.params: Input should be a valid dictionary"]:
        assert fragment in message


def test_integral_floats_for_int_keys():
    config = DeepSpeedConfig({"train_batch_size": 16.0, "steps_per_print": 2e3,
                              "fp16": {"initial_scale_power": 16.0}}, world_size=2)
    assert config.train_batch_size == 16 and isinstance(config.train_batch_size, int)
    assert config.steps_per_print == 2000 and config.core.fp16.initial_scale_power == 16
