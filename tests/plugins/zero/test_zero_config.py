"""The `zero_optimization` / `aio` config models: documented defaults, aliases, deprecations and
the cross-key rules (api-part1 §5.2/§5.3, hf-integration §1.3/§1.4/§6)."""
import pathlib
import sys

import pytest
from pydantic import ValidationError

from deepspeed.config.errors import ConfigDeprecationWarning, DeepSpeedConfigError
from deepspeed.config.validation import validate_config
from deepspeed.zero.aio_config import AioConfig
from deepspeed.zero.config import DeepSpeedZeroConfig, ZeroStageEnum, from_legacy_bool
from deepspeed.zero.offload_config import (DeepSpeedZeroOffloadOptimizerConfig, DeepSpeedZeroOffloadParamConfig,
                                           OffloadDeviceEnum)

SECTIONS = {"zero_optimization": DeepSpeedZeroConfig, "aio": AioConfig}

DOC_DEFAULTS = {
    "stage": 0, "contiguous_gradients": True, "reduce_scatter": True, "reduce_bucket_size": 500_000_000,
    "use_multi_rank_bucket_allreduce": True, "allgather_partitions": True,
    "allgather_bucket_size": 500_000_000, "load_from_fp32_weights": True, "elastic_checkpoint": False,
    "offload_param": None, "offload_optimizer": None, "sub_group_size": 1_000_000_000,
    "cpu_offload_use_pin_memory": None, "prefetch_bucket_size": 50_000_000,
    "param_persistence_threshold": 100_000, "model_persistence_threshold": sys.maxsize,
    "max_live_parameters": 1_000_000_000, "max_reuse_distance": 1_000_000_000,
    "gather_16bit_weights_on_model_save": False, "ignore_unused_parameters": True, "legacy_stage1": False,
    "round_robin_gradients": False, "zero_hpz_partition_size": 1, "zero_quantized_weights": False,
    "zero_quantized_nontrainable_weights": False, "zero_quantized_gradients": False, "mics_shard_size": -1,
    "mics_hierarchical_params_gather": False, "memory_efficient_linear": True,
    "pipeline_loading_checkpoint": False, "override_module_apply": True,
}


def zero(**kwargs) -> DeepSpeedZeroConfig:
    return DeepSpeedZeroConfig.model_validate(kwargs)


def test_defaults_equal_the_documented_table():
    config = DeepSpeedZeroConfig()
    for key, value in DOC_DEFAULTS.items():
        assert getattr(config, key) == value, key
    assert config.stage is ZeroStageEnum.disabled
    assert config.overlap_comm is False  # None resolves to stage == 3


def test_offload_defaults_equal_the_documented_tables():
    param = DeepSpeedZeroOffloadParamConfig()
    assert (param.device, param.nvme_path, param.buffer_count, param.buffer_size, param.max_in_cpu,
            param.pin_memory) == (OffloadDeviceEnum.none, None, 5, 100_000_000, 1_000_000_000, False)
    opt = DeepSpeedZeroOffloadOptimizerConfig()
    assert (opt.device, opt.nvme_path, opt.buffer_count, opt.pin_memory, opt.pipeline_read, opt.pipeline_write,
            opt.fast_init, opt.ratio) == (OffloadDeviceEnum.none, None, 4, False, False, False, False, 1.0)
    assert opt.pipeline is False
    assert DeepSpeedZeroOffloadOptimizerConfig(pipeline_write=True).pipeline is True


def test_stage_enum_values():
    assert [int(s) for s in (ZeroStageEnum.disabled, ZeroStageEnum.optimizer_states, ZeroStageEnum.gradients,
                             ZeroStageEnum.weights)] == [0, 1, 2, 3]
    assert ZeroStageEnum.max_stage == 3
    with pytest.raises(ValidationError, match="stage"):
        zero(stage=4)


@pytest.mark.parametrize("bad", [4, -1, "x", 2.5, None, True])
def test_a_bad_stage_lists_each_stage_once(bad):
    with pytest.raises(ValidationError) as caught:
        zero(stage=bad)
    message = str(caught.value)
    assert "must be 0, 1, 2 or 3" in message and "3 or 3" not in message
    assert repr(bad) in message


@pytest.mark.parametrize("section,named", [
    ({"round_robin_gradients": True}, "round_robin_gradients"),
    ({"legacy_stage1": True}, "legacy_stage1")])
def test_keys_without_effect_say_so_once(section, named, caplog):
    import logging

    from deepspeed.config.without_effect import reset_without_effect_warnings

    reset_without_effect_warnings()
    with caplog.at_level(logging.WARNING):  # the core warns for every section it validates
        validate_config({"zero_optimization": {"stage": 2, **section}}, SECTIONS)
        validate_config({"zero_optimization": {"stage": 2, **section}}, SECTIONS)  # once only
        validate_config({"zero_optimization": {"stage": 2}}, SECTIONS)
    warned = [r.getMessage() for r in caplog.records if "no effect" in r.getMessage()]
    assert len(warned) == 1 and f"zero_optimization.{named} has no effect" in warned[0]


@pytest.mark.parametrize("alias,field", [
    ("stage3_max_live_parameters", "max_live_parameters"),
    ("stage3_prefetch_bucket_size", "prefetch_bucket_size"),
    ("stage3_param_persistence_threshold", "param_persistence_threshold"),
    ("stage3_model_persistence_threshold", "model_persistence_threshold"),
    ("stage3_max_reuse_distance", "max_reuse_distance"),
])
def test_stage3_aliases_set_the_unprefixed_field(alias, field):
    assert getattr(zero(**{alias: 5}), field) == 5
    assert getattr(zero(**{field: 7}), field) == 7


def test_gather_16bit_alias_and_deprecated_fp16_name():
    assert zero(stage3_gather_16bit_weights_on_model_save=True).gather_16bit_weights_on_model_save is True
    with pytest.warns(ConfigDeprecationWarning, match="stage3_gather_fp16_weights_on_model_save"):
        config = zero(stage3_gather_fp16_weights_on_model_save=True)
    assert config.gather_16bit_weights_on_model_save is True
    with pytest.raises(ValidationError, match="stage3_gather_fp16_weights_on_model_save.*"
                                              "stage3_gather_16bit_weights_on_model_save"):
        zero(stage3_gather_fp16_weights_on_model_save=True, stage3_gather_16bit_weights_on_model_save=True)


@pytest.mark.parametrize("key", ["reduce_bucket_size", "allgather_bucket_size", "sub_group_size",
                                 "stage3_prefetch_bucket_size", "max_live_parameters", "buffer_count"])
def test_negative_int_knobs_are_rejected(key):
    data = {"offload_optimizer": {"buffer_count": -1}} if key == "buffer_count" else {key: -1}
    with pytest.raises(ValidationError, match=key):
        DeepSpeedZeroConfig.model_validate(data)


def test_overlap_comm_resolves_from_stage_unless_set():
    assert zero(stage=3).overlap_comm is True
    assert zero(stage=2).overlap_comm is False
    assert zero(stage=1).overlap_comm is False
    assert zero(stage=2, overlap_comm=True).overlap_comm is True
    assert zero(stage=3, overlap_comm=False).overlap_comm is False


def test_integral_floats_and_auto_values():
    config = zero(stage=3, reduce_bucket_size=5e8, sub_group_size=1e9, stage3_max_live_parameters=1e9)
    assert (config.reduce_bucket_size, config.sub_group_size, config.max_live_parameters) == \
        (500_000_000, 1_000_000_000, 1_000_000_000)
    assert isinstance(config.reduce_bucket_size, int)
    auto = zero(reduce_bucket_size="auto", stage3_prefetch_bucket_size="auto",
                stage3_param_persistence_threshold="auto")
    assert (auto.reduce_bucket_size, auto.prefetch_bucket_size, auto.param_persistence_threshold) == \
        (500_000_000, 50_000_000, 100_000)
    with pytest.warns(UserWarning, match="prefetch_bucket_size"):
        assert zero(stage3_prefetch_bucket_size=0.9 * 2048 * 2048).prefetch_bucket_size == 3774873
    with pytest.raises(ValidationError, match="reduce_bucket_size"):
        zero(reduce_bucket_size="lots")


def test_cpu_offload_maps_to_offload_optimizer_with_a_warning():
    with pytest.warns(ConfigDeprecationWarning, match="cpu_offload"):
        config = zero(stage=2, cpu_offload=True)
    assert config.offload_optimizer.device == "cpu"
    assert config.offload_optimizer_device is OffloadDeviceEnum.cpu
    with pytest.warns(ConfigDeprecationWarning):
        assert zero(stage=2, cpu_offload=False).offload_optimizer is None


def test_cpu_offload_param_and_pin_memory_mapping():
    with pytest.warns(ConfigDeprecationWarning):
        config = zero(stage=3, cpu_offload=True, cpu_offload_param=True, cpu_offload_use_pin_memory=True)
    assert config.offload_param.device == "cpu" and config.offload_param.pin_memory is True
    assert config.offload_optimizer.pin_memory is True
    with pytest.warns(ConfigDeprecationWarning):
        only_opt = zero(stage=2, offload_optimizer={"device": "cpu"}, cpu_offload_use_pin_memory=True)
    assert only_opt.offload_optimizer.pin_memory is True and only_opt.offload_param is None
    with pytest.warns(ConfigDeprecationWarning), \
            pytest.raises(ValidationError, match="cpu_offload_use_pin_memory.*offload_optimizer.pin_memory"):
        zero(stage=2, offload_optimizer={"device": "cpu", "pin_memory": False}, cpu_offload_use_pin_memory=True)


@pytest.mark.parametrize("old,new", [("cpu_offload", "offload_optimizer"), ("cpu_offload_param", "offload_param")])
def test_deprecated_offload_key_with_its_replacement_is_an_error(old, new):
    with pytest.raises(ValidationError, match=f"'{old}'.*'{new}'"):
        zero(stage=3, **{old: True, new: {"device": "cpu"}})


def test_unknown_key_is_rejected_by_name():
    with pytest.raises(ValidationError, match="bogus"):
        zero(bogus=1)
    with pytest.raises(DeepSpeedConfigError, match="did you mean 'zero_optimization.stage3_max_live_parameters'"):
        validate_config({"zero_optimization": {"stage3_max_live_parameter": 5}}, SECTIONS)


def test_ratio_bounds_and_partial_offload_needs_stage3():
    with pytest.raises(ValidationError, match="ratio"):
        zero(stage=3, offload_optimizer={"device": "cpu", "ratio": 1.5})
    with pytest.raises(ValidationError, match="Partial offloading only supported for ZeRO Stage 3"):
        zero(stage=2, offload_optimizer={"device": "cpu", "ratio": 0.5})
    assert zero(stage=3, offload_optimizer={"device": "cpu", "ratio": 0.5}).offload_optimizer.ratio == 0.5


def test_offload_param_needs_stage3():
    with pytest.raises(ValidationError, match=r"offload_param is only supported with ZeRO stage 3 \(stage is 2\)"):
        zero(stage=2, offload_param={"device": "cpu"})
    # an explicit "none" device offloads nothing, so it is harmless at any stage
    assert zero(stage=2, offload_param={"device": "none"}).offload_param_device is OffloadDeviceEnum.none
    # a later assignment is checked too
    config = zero(stage=3, offload_param={"device": "cpu"})
    with pytest.raises(ValidationError, match="offload_param"):
        config.stage = 2


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_offload_optimizer_cpu_and_nvme_are_allowed_at_stages_1_to_3(stage, tmp_path):
    assert zero(stage=stage, offload_optimizer={"device": "cpu"}).offload_optimizer_device == "cpu"
    config = zero(stage=stage, offload_optimizer={"device": "nvme", "nvme_path": str(tmp_path)})
    assert config.offload_optimizer.device is OffloadDeviceEnum.nvme
    assert config.offload_optimizer.nvme_path == str(tmp_path)


def test_nvme_needs_a_path_and_devices_are_validated():
    with pytest.raises(ValidationError, match="nvme_path"):
        zero(stage=3, offload_param={"device": "nvme"})
    with pytest.raises(ValidationError, match="device"):
        zero(stage=2, offload_optimizer={"device": "disk"})
    assert DeepSpeedZeroOffloadParamConfig(device="CPU").device is OffloadDeviceEnum.cpu
    assert DeepSpeedZeroOffloadParamConfig(device="nvme", nvme_path=pathlib.Path("/x/y")).nvme_path == "/x/y"


def test_legacy_boolean_form():
    with pytest.warns(ConfigDeprecationWarning, match="deprecated"):
        assert from_legacy_bool(True).stage == 1
    with pytest.warns(ConfigDeprecationWarning):
        assert DeepSpeedZeroConfig.from_legacy_bool(False).stage == 0
    with pytest.warns(ConfigDeprecationWarning):
        _, sections = validate_config({"zero_optimization": True}, SECTIONS)
    assert sections["zero_optimization"].stage is ZeroStageEnum.optimizer_states
    with pytest.raises(TypeError, match="boolean"):
        from_legacy_bool("yes")
    assert zero(allgather_size=1e8).allgather_size == 100_000_000


# -- the documentation's example configs (commas fixed) ----------------------------------------
_OPTIMIZER = {"type": "AdamW", "params": {"lr": 0.001, "betas": [0.8, 0.999], "eps": 1e-8, "weight_decay": 3e-7}}

DOC_EXAMPLES = [
    {"zero_optimization": {"stage": 3}, "fp16": {"enabled": True}, "optimizer": _OPTIMIZER},
    {"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"}}},
    {"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"}, "offload_param": {"device": "cpu"}}},
    {"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "nvme", "nvme_path": "/nvme_data"},
                           "offload_param": {"device": "nvme", "nvme_path": "/nvme_data"}}},
]


@pytest.mark.parametrize("index", range(len(DOC_EXAMPLES)))
def test_doc_example_configs_parse(index):
    _, sections = validate_config(DOC_EXAMPLES[index], SECTIONS)
    config = sections["zero_optimization"]
    assert config.stage is ZeroStageEnum.weights
    expected_devices = [("none", "none"), ("cpu", "none"), ("cpu", "cpu"), ("nvme", "nvme")][index]
    assert (config.offload_optimizer_device, config.offload_param_device) == expected_devices


def test_hf_nvme_example_with_nested_aio_and_auto_values():
    """The HF docs' ZeRO-Infinity example: `aio` nested in the section, `thread_count`, "auto"s."""
    raw = {"zero_optimization": {
        "stage": 3,
        "offload_optimizer": {"device": "nvme", "nvme_path": "/local_nvme", "pin_memory": True,
                              "buffer_count": 4, "fast_init": False},
        "offload_param": {"device": "nvme", "nvme_path": "/local_nvme", "pin_memory": True, "buffer_count": 5,
                          "buffer_size": 1e8, "max_in_cpu": 1e9},
        "aio": {"block_size": 262144, "queue_depth": 32, "thread_count": 1, "single_submit": False,
                "overlap_events": True},
        "overlap_comm": True, "contiguous_gradients": True, "sub_group_size": 1e9,
        "reduce_bucket_size": "auto", "stage3_prefetch_bucket_size": "auto",
        "stage3_param_persistence_threshold": "auto", "stage3_max_live_parameters": 1e9,
        "stage3_max_reuse_distance": 1e9, "stage3_gather_16bit_weights_on_model_save": True}}
    with pytest.warns(ConfigDeprecationWarning, match="thread_count"):
        _, sections = validate_config(raw, SECTIONS)
    config = sections["zero_optimization"]
    assert config.aio.block_size == 262144 and config.aio.queue_depth == 32
    assert config.aio.intra_op_parallelism == 1
    assert config.offload_param.buffer_size == 100_000_000 and config.offload_param.max_in_cpu == 1_000_000_000
    assert config.reduce_bucket_size == 500_000_000 and config.prefetch_bucket_size == 50_000_000
    assert config.gather_16bit_weights_on_model_save is True


def test_to_dict_round_trips():
    config = zero(stage=3, offload_optimizer={"device": "cpu"}, stage3_max_live_parameters=3)
    again = DeepSpeedZeroConfig.model_validate(config.to_dict())
    assert again == config


# -- aio ---------------------------------------------------------------------------------------
def test_aio_defaults_alias_and_handle_kwargs():
    aio = AioConfig()
    assert (aio.block_size, aio.queue_depth, aio.intra_op_parallelism, aio.single_submit, aio.overlap_events,
            aio.use_gds) == (1048576, 8, 1, False, True, False)
    with pytest.warns(ConfigDeprecationWarning, match="thread_count"):
        aio = AioConfig.model_validate({"thread_count": 4, "block_size": 4096})
    assert aio.intra_op_parallelism == 4
    kwargs = aio.handle_kwargs()
    assert kwargs == {"block_size": 4096, "queue_depth": 8, "single_submit": False, "overlap_events": True,
                      "intra_op_parallelism": 4}
    from deepspeed.ops.aio import fallback

    handle = fallback.aio_handle(**kwargs)  # the handle accepts exactly these keywords
    assert handle.get_intra_op_parallelism() == 4 and handle.get_block_size() == 4096


@pytest.mark.parametrize("key", ["block_size", "queue_depth", "intra_op_parallelism"])
def test_aio_ints_must_be_positive(key):
    with pytest.raises(ValidationError, match=key):
        AioConfig.model_validate({key: 0})


def test_aio_thread_count_with_its_replacement_is_an_error():
    with pytest.raises(ValidationError, match="'thread_count'.*'intra_op_parallelism'"):
        AioConfig.model_validate({"thread_count": 1, "intra_op_parallelism": 2})


def test_optimizer_policy_keys_belong_to_the_zero_plugin():
    """``zero_allow_untested_optimizer`` / ``zero_force_ds_cpu_optimizer`` are ZeRO's top-level
    sections (the core validates none of them): defaults False / True when omitted, strict
    booleans when given; the tested-optimizer list is ZeRO's too."""
    import torch

    from deepspeed.config import DeepSpeedConfig
    from deepspeed.ops.adam import DeepSpeedCPUAdam
    from deepspeed.zero.plugin import (ALLOW_UNTESTED, FORCE_DS_CPU, ZeroPlugin,
                                       is_zero_supported_optimizer, policy)

    sections = ZeroPlugin.config_sections
    omitted = DeepSpeedConfig({"train_batch_size": 1}, sections=sections, world_size=1)
    assert (policy(omitted, ALLOW_UNTESTED), policy(omitted, FORCE_DS_CPU)) == (False, True)
    given = DeepSpeedConfig({"train_batch_size": 1, ALLOW_UNTESTED: True, FORCE_DS_CPU: False},
                            sections=sections, world_size=1)
    assert (policy(given, ALLOW_UNTESTED), policy(given, FORCE_DS_CPU)) == (True, False)
    with pytest.raises(DeepSpeedConfigError, match=ALLOW_UNTESTED):
        DeepSpeedConfig({"train_batch_size": 1, ALLOW_UNTESTED: "yes"}, sections=sections,
                        world_size=1)
    assert is_zero_supported_optimizer(DeepSpeedCPUAdam(torch.nn.Linear(2, 1).parameters()))
    assert not is_zero_supported_optimizer(torch.optim.SGD(torch.nn.Linear(2, 1).parameters(),
                                                           lr=0.1))
