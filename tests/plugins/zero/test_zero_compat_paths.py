"""Upstream's ZeRO import paths (docs, HF integration) reach the zero plugin's real homes, and
the plugin is found the way every plugin is: through its entry point."""
import importlib

import pytest

from deepspeed.config.errors import ConfigDeprecationWarning

PATHS = [
    ("deepspeed.runtime.zero.config", "DeepSpeedZeroConfig", "deepspeed.zero.config"),
    ("deepspeed.runtime.zero.config", "ZeroStageEnum", "deepspeed.zero.config"),
    # the API reference documents the offload sections under the config module
    ("deepspeed.runtime.zero.config", "DeepSpeedZeroOffloadParamConfig",
     "deepspeed.zero.offload_config"),
    ("deepspeed.runtime.zero.config", "DeepSpeedZeroOffloadOptimizerConfig",
     "deepspeed.zero.offload_config"),
    ("deepspeed.runtime.zero.offload_config", "OffloadDeviceEnum", "deepspeed.zero.offload_config"),
    ("deepspeed.runtime.zero.offload_config", "DeepSpeedZeroOffloadOptimizerConfig",
     "deepspeed.zero.offload_config"),
    ("deepspeed.runtime.zero.stage_1_and_2", "DeepSpeedZeroOptimizer",
     "deepspeed.zero.stage_1_and_2"),
    ("deepspeed.runtime.zero.stage_1_and_2", "estimate_zero2_model_states_mem_needs_all_live",
     "deepspeed.zero.estimators"),
    ("deepspeed.runtime.zero.stage_1_and_2", "estimate_zero2_model_states_mem_needs_all_cold",
     "deepspeed.zero.estimators"),
    ("deepspeed.runtime.zero.stage3", "estimate_zero3_model_states_mem_needs_all_live",
     "deepspeed.zero.estimators"),
    ("deepspeed.runtime.zero.stage3", "estimate_zero3_model_states_mem_needs_all_cold",
     "deepspeed.zero.estimators"),
    ("deepspeed.zero", "DeepSpeedZeroOptimizer", "deepspeed.zero.stage_1_and_2"),
    ("deepspeed.runtime.zero.partition_parameters", "Init", "deepspeed.zero.partition_parameters"),
    ("deepspeed.runtime.zero.partition_parameters", "GatheredParameters",
     "deepspeed.zero.gathered_parameters"),
    ("deepspeed.runtime.zero.partition_parameters", "ZeroParamStatus",
     "deepspeed.zero.partition_parameters"),
    ("deepspeed.runtime.zero.partition_parameters", "register_external_parameter",
     "deepspeed.zero.stage3"),
    ("deepspeed.zero", "Init", "deepspeed.zero.partition_parameters"),
    ("deepspeed.zero", "GatheredParameters", "deepspeed.zero.gathered_parameters"),
    ("deepspeed.zero", "MiCS_Init", "deepspeed.zero.mics"),
    ("deepspeed.runtime.zero.mics", "MiCS_Init", "deepspeed.zero.mics"),
    ("deepspeed.zero", "TiledLinear", "deepspeed.zero.tiling"),
    ("deepspeed.zero", "TiledLinearReturnBias", "deepspeed.zero.tiling"),
    ("deepspeed.runtime.zero.tiling", "TiledLinear", "deepspeed.zero.tiling"),
    ("deepspeed.runtime.zero.tiling", "TiledLinearReturnBias", "deepspeed.zero.tiling"),
]


@pytest.mark.parametrize("path,name,home", PATHS)
def test_upstream_path(path, name, home):
    assert getattr(importlib.import_module(path), name) is \
        getattr(importlib.import_module(home), name)


def test_zero_plugin_is_installed_through_its_entry_point():
    from deepspeed.plugin_manager import PluginCatalog, installed_plugins

    assert installed_plugins()["zero"].value == "deepspeed.zero.plugin:ZeroPlugin"
    catalog = PluginCatalog()
    assert catalog.sections_of("zero") == ["zero_optimization", "aio",
                                           "zero_allow_untested_optimizer",
                                           "zero_force_ds_cpu_optimizer"]


@pytest.mark.parametrize("raw,enabled", [
    ({"zero_optimization": {"stage": 2}}, True),
    ({"zero_optimization": {"stage": 0}}, False),
    ({"zero_optimization": True}, True),  # the legacy boolean form means stage 1
    ({"aio": {"block_size": 4096}}, False),
    ({}, False),
])
def test_enabled_by_a_nonzero_stage(raw, enabled):
    from deepspeed.config import DeepSpeedConfig
    from deepspeed.plugin_manager import PluginCatalog

    catalog = PluginCatalog()
    if isinstance(raw.get("zero_optimization"), bool):
        with pytest.warns(ConfigDeprecationWarning, match="zero_optimization"):
            config = DeepSpeedConfig(dict(raw, train_batch_size=2), sections=catalog.sections,
                                     world_size=1)
    else:
        config = DeepSpeedConfig(dict(raw, train_batch_size=2), sections=catalog.sections,
                                 world_size=1)
    assert ("zero" in catalog.enabled_names(config)) is enabled


def test_deprecated_fields_read_from_their_replacements():
    """The API reference lists cpu_offload, cpu_offload_param and
    stage3_gather_fp16_weights_on_model_save as attributes of the ZeRO config: set as keys they
    map to their replacements, and read as attributes they answer from them."""
    from deepspeed.runtime.zero.config import DeepSpeedZeroConfig

    with pytest.warns(ConfigDeprecationWarning):
        old = DeepSpeedZeroConfig.model_validate({
            "stage": 3, "cpu_offload": True, "cpu_offload_param": True,
            "stage3_gather_fp16_weights_on_model_save": True})
    assert old.offload_optimizer.device == "cpu" and old.offload_param.device == "cpu"
    assert old.cpu_offload and old.cpu_offload_param
    assert old.stage3_gather_fp16_weights_on_model_save
    new = DeepSpeedZeroConfig.model_validate({"stage": 3, "offload_param": {"device": "nvme",
                                                                           "nvme_path": "/x"}})
    assert not new.cpu_offload and not new.cpu_offload_param
    assert not new.stage3_gather_fp16_weights_on_model_save
