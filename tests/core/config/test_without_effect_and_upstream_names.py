"""Keys accepted without effect warn once naming themselves; upstream's attribute names on
`DeepSpeedConfig`; one definition of the comms_logger settings; the legacy boolean ZeRO form."""
import logging

import pytest

from deepspeed.config import DeepSpeedConfig, DeepSpeedConfigError, DeepSpeedConfigModel
from deepspeed.config.config import UPSTREAM_ATTRIBUTES
from deepspeed.config.core_sections import CoreConfig
from deepspeed.config.without_effect import (keys_without_effect, reset_without_effect_warnings,
                                             warn_without_effect)

BASE = {"train_batch_size": 4}


@pytest.fixture
def warnings_seen():
    from deepspeed.utils.logging import logger

    reset_without_effect_warnings()
    lines = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = lambda record: lines.append(record.getMessage())
    logger.addHandler(handler)
    yield lines
    logger.removeHandler(handler)
    reset_without_effect_warnings()


@pytest.mark.parametrize("section, path", [
    ({"checkpoint": {"parallel_write": {"pipeline_stage": True}}},
     "checkpoint.parallel_write.pipeline_stage"),
    ({"nebula": {"enabled": True, "persistent_storage_path": "/x"}}, "nebula.persistent_storage_path"),
    ({"datastates_ckpt": {"host_cache_size": 4}}, "datastates_ckpt.host_cache_size"),
])
def test_a_core_key_without_effect_warns_once_naming_itself(warnings_seen, section, path):
    DeepSpeedConfig({**BASE, **section}, sections={}, world_size=1)
    DeepSpeedConfig({**BASE, **section}, sections={}, world_size=1)  # once per process
    assert len(warnings_seen) == 1
    assert warnings_seen[0].startswith(f"{path} has no effect here: ")


def test_defaults_and_absent_sections_warn_nothing(warnings_seen):
    DeepSpeedConfig({**BASE, "fp16": {"enabled": True, "fp16_master_weights_and_grads": False},
                     "bf16": {"immediate_grad_update": False},
                     "datastates_ckpt": {"host_cache_size": 16}}, sections={}, world_size=1)
    assert warnings_seen == []
    assert keys_without_effect(CoreConfig()) == []


def test_implemented_keys_are_not_in_any_table():
    listed = {path for path, _ in keys_without_effect(CoreConfig.model_validate(
        {"memory_breakdown": True, "sparse_gradients": True, "dump_state": True,
         "fp16": {"fp16_master_weights_and_grads": True},
         "bf16": {"immediate_grad_update": True}}))}
    assert listed == set()


def test_plugin_sections_use_the_same_table(warnings_seen):
    class Feature(DeepSpeedConfigModel):
        knob: int = 1
        without_effect = {"knob": "nothing here turns it"}

    DeepSpeedConfig({**BASE, "feature": {"knob": 2}}, sections={"feature": Feature}, world_size=1)
    assert warnings_seen == ["feature.knob has no effect here: nothing here turns it"]
    assert warn_without_effect(Feature(knob=3), "feature") == []  # already said


def _reasons(model, seen=None):
    """(class name, key, reason) of every ``without_effect`` row of ``model`` and the section
    models inside it."""
    from deepspeed.config.model import model_classes_in

    seen = set() if seen is None else seen
    if model in seen:
        return []
    seen.add(model)
    found = [(model.__name__, key, why) for key, why in getattr(model, "without_effect", {}).items()]
    for info in model.model_fields.values():
        for inner in model_classes_in(info.annotation):
            found.extend(_reasons(inner, seen))
    return found


def test_no_reason_says_an_installed_feature_is_missing():
    """The reasons are fixed text, and some written before a plugin existed went on saying "no
    tensor-parallel plugin is installed" after it was. A reason says what this code does with
    the key, never what the build lacks: that is the catalog's to know."""
    import re

    from deepspeed.config.model import model_classes_in
    from deepspeed.plugin_manager import PluginCatalog

    models = [CoreConfig] + [m for section in PluginCatalog().sections.values()
                             for m in model_classes_in(section)]
    claims = re.compile(r"\bno [\w-]+ (plugin|engine)\b|plugin is (not )?installed|does not ship")
    rows = [row for model in models for row in _reasons(model)]
    assert any(key == "round_robin_gradients" for _, key, _ in rows)  # the plugins' tables are read
    assert [row for row in rows if claims.search(row[2])] == []


def test_a_table_naming_no_field_is_a_plugin_bug():
    class Broken(DeepSpeedConfigModel):
        knob: int = 1
        without_effect = {"knbo": "typo"}

    with pytest.raises(KeyError, match="knbo"):
        keys_without_effect(Broken())


# -- upstream's attribute names --------------------------------------------------------------------
def test_every_upstream_attribute_reads_its_core_field():
    config = DeepSpeedConfig({**BASE, "fp16": {"enabled": True, "loss_scale": 128},
                              "gradient_clipping": 1.5, "sparse_gradients": True,
                              "checkpoint": {"load_universal": True}}, sections={}, world_size=1)
    for name in UPSTREAM_ATTRIBUTES:
        getattr(config, name)
    assert config.fp16_enabled and config.loss_scale == 128 and config.gradient_clipping == 1.5
    assert config.sparse_gradients_enabled and config.load_universal_checkpoint
    assert config.activation_checkpointing_config is config.core.activation_checkpointing
    assert set(UPSTREAM_ATTRIBUTES) <= set(dir(config))


def test_names_that_are_not_upstream_attributes_are_not_answered():
    config = DeepSpeedConfig(BASE, sections={}, world_size=1)
    for name in ("bf16_enabled", "dynamic_loss_scale", "sparse_gradients", "nonsense"):
        with pytest.raises(AttributeError, match=name):
            getattr(config, name)
    assert not hasattr(config, "bf16_immediate_grad_update")


def test_copy_and_pickle_do_not_reach_the_table():
    import copy
    import pickle

    config = DeepSpeedConfig(BASE, sections={}, world_size=1)
    assert pickle.loads(pickle.dumps(config)).train_batch_size == 4
    assert copy.deepcopy(config).gradient_clipping == config.gradient_clipping


# -- comms_logger: one definition ------------------------------------------------------------------
def test_the_comms_logger_section_is_the_core_settings_model():
    from deepspeed.comm.state import CommsLoggerSettings
    from deepspeed.comms_logging.config import CommsLoggerConfig
    from deepspeed.comms_logging.plugin import CommsLoggerPlugin

    assert CommsLoggerConfig is CommsLoggerSettings
    assert CommsLoggerPlugin.config_sections["comms_logger"] is CommsLoggerSettings
    with pytest.raises(DeepSpeedConfigError, match=r"comms_logger\.verbose: must be true or false"):
        DeepSpeedConfig({**BASE, "comms_logger": {"verbose": "yes"}},
                        sections={"comms_logger": CommsLoggerSettings}, world_size=1)


# -- the legacy boolean zero_optimization form is the ZeRO section's business -------------------
def test_legacy_boolean_zero_optimization_means_stage_1_or_0():
    pytest.importorskip("deepspeed.zero")
    from deepspeed.config import ConfigDeprecationWarning

    with pytest.warns(ConfigDeprecationWarning):
        on = DeepSpeedConfig({**BASE, "zero_optimization": True}, world_size=1)
    assert int(on.section("zero_optimization").stage) == 1
    with pytest.warns(ConfigDeprecationWarning):
        off = DeepSpeedConfig({**BASE, "zero_optimization": False}, world_size=1)
    assert int(off.section("zero_optimization").stage) == 0
