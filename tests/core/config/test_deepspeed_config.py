"""DeepSpeedConfig end to end: sources, plugin sections, feature keys, "auto", output."""
import base64
import json
import logging
from pathlib import Path
from typing import Literal, Optional, Union

import pytest
from pydantic import ConfigDict, Field

from deepspeed.config import (FEATURE_SECTIONS, DeepSpeedConfig, DeepSpeedConfigError,
                              DeepSpeedConfigModel, load_config_source)
from deepspeed.config.model import flatten

DOC_EXAMPLES = Path(__file__).parent / "doc_examples"

CONFIG = {
    "train_micro_batch_size_per_gpu": 4,
    "gradient_accumulation_steps": 3,
    "gradient_clipping": 1.0,
    "steps_per_print": 2000,
    "fp16": {"enabled": True, "loss_scale": 0, "loss_scale_window": 1000, "initial_scale_power": 16,
             "hysteresis": 2, "min_loss_scale": 1},
    "optimizer": {"type": "AdamW", "params": {"lr": 3e-5, "betas": [0.8, 0.999], "eps": 1e-8,
                                              "weight_decay": 3e-7}},
    "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": 0, "warmup_max_lr": 3e-5,
                                                 "warmup_num_steps": 500}},
    "checkpoint": {"use_node_local_storage": True},
}


# -- a stand-in plugin section, shaped like the ZeRO one -------------------------------------------
class OffloadSection(DeepSpeedConfigModel):
    device: Literal["none", "cpu", "nvme"] = "none"
    pin_memory: bool = True


class ZenFlowSection(DeepSpeedConfigModel):
    select_strategy: Literal["auto", "step", "epoch"] = "auto"
    select_interval: Union[Literal["auto"], int] = "auto"
    topk_ratio: float = Field(0.1, ge=0, le=1)


class ZeroSection(DeepSpeedConfigModel):
    stage: int = Field(0, ge=0, le=3)
    reduce_bucket_size: int = Field(500_000_000, ge=0)
    prefetch_bucket_size: int = Field(50_000_000, ge=0, alias="stage3_prefetch_bucket_size")
    offload_optimizer: Optional[OffloadSection] = None
    zenflow: Optional[ZenFlowSection] = None
    mode: str = Field("x", json_schema_extra={"accepts_auto": True})


class PermissiveSection(DeepSpeedConfigModel):
    """For doc examples whose plugin section content is not under test here."""
    model_config = ConfigDict(extra="allow")


ZERO = {"zero_optimization": ZeroSection}


def _encoded(config, encoder=base64.urlsafe_b64encode):
    return encoder(json.dumps(config).encode()).decode()


# -- sources -------------------------------------------------------------------------------------
def test_dict_json_hjson_and_base64_resolve_equally(tmp_path):
    json_path = tmp_path / "ds.json"
    json_path.write_text(json.dumps(CONFIG, indent=2))
    hjson_path = tmp_path / "ds_trailing.json"
    hjson_path.write_text(json.dumps(CONFIG, indent=2).replace("\n  }", ",\n  }").replace("\n}", ",\n}"))
    assert hjson_path.read_text().count(",\n}") == 1  # really has trailing commas
    resolved = [DeepSpeedConfig(source, world_size=2).to_dict()
                for source in (CONFIG, str(json_path), json_path, hjson_path, _encoded(CONFIG),
                               _encoded(CONFIG, base64.b64encode))]
    assert all(r == resolved[0] for r in resolved)
    assert resolved[0]["train_batch_size"] == 24


def test_raw_is_the_users_config_and_is_not_shared():
    config = DeepSpeedConfig(CONFIG, world_size=2)
    assert config.raw == CONFIG and config.raw is not CONFIG
    config.raw["optimizer"]["params"]["lr"] = 1.0
    assert CONFIG["optimizer"]["params"]["lr"] == 3e-5


def test_to_dict_round_trips():
    first = DeepSpeedConfig(CONFIG, world_size=2).to_dict()
    assert DeepSpeedConfig(first, world_size=2).to_dict() == first


def test_fp32_doc_example_validates():
    config = dict(load_config_source(DOC_EXAMPLES / "hf_fp32_trailing_comma.json"), train_batch_size=2)
    assert not DeepSpeedConfig(config, world_size=1).fp16_enabled


def test_doc_example_without_batch_size_says_so():
    with pytest.raises(DeepSpeedConfigError) as info:
        DeepSpeedConfig(DOC_EXAMPLES / "hf_fp32_trailing_comma.json", world_size=1)
    assert "Either train_batch_size or train_micro_batch_size_per_gpu needs to be provided" in str(info.value)
    assert "hf_fp32_trailing_comma.json" in str(info.value)


# -- plugin sections -------------------------------------------------------------------------------
def test_plugin_section_is_validated_and_returned():
    config = DeepSpeedConfig({"train_batch_size": 8, "zero_optimization": {
        "stage": 2, "stage3_prefetch_bucket_size": 1e6, "offload_optimizer": {"device": "cpu"}}},
        sections=ZERO, world_size=2)
    zero = config.section("zero_optimization")
    assert isinstance(zero, ZeroSection)
    assert zero.prefetch_bucket_size == 1_000_000 and zero.offload_optimizer.device == "cpu"
    assert config.has_section("zero_optimization")
    assert zero.stage == 2
    assert config.to_dict()["zero_optimization"]["prefetch_bucket_size"] == 1_000_000


def test_registered_but_omitted_plugin_section_is_none():
    config = DeepSpeedConfig({"train_batch_size": 8}, sections=ZERO, world_size=1)
    assert config.section("zero_optimization") is None
    assert not config.has_section("zero_optimization")
    assert "zero_optimization" not in config.to_dict()


def test_plugin_section_errors_are_path_named():
    with pytest.raises(DeepSpeedConfigError) as info:
        DeepSpeedConfig({"train_batch_size": 8, "zero_optimization": {
            "stage": 4, "reduce_bucket_size": 2.5, "offload_optimizer": {"device": "gpu", "pin_memroy": True},
            "stage3_prefetch_bucket_sise": 1}}, sections=ZERO, world_size=1)
    message = str(info.value)
    assert "5 problems" in message
    for fragment in [
        "zero_optimization.stage: Input should be less than or equal to 3 (got 4)",
        "zero_optimization.reduce_bucket_size: Input should be a valid integer, got a number with a fractional part",
        "zero_optimization.offload_optimizer.device: Input should be 'none', 'cpu' or 'nvme' (got 'gpu')",
        "zero_optimization.offload_optimizer.pin_memroy: unknown key; did you mean "
        "'zero_optimization.offload_optimizer.pin_memory'?",
        "zero_optimization.stage3_prefetch_bucket_sise: unknown key; did you mean "
        "'zero_optimization.stage3_prefetch_bucket_size'?",
    ]:
        assert fragment in message


def test_a_message_that_names_the_value_is_not_followed_by_it_again():
    from pydantic import field_validator

    class Odd(DeepSpeedConfigModel):
        knob: int = 1

        @field_validator("knob")
        @classmethod
        def _odd(cls, value):
            if value % 2 == 0:
                raise ValueError(f"must be odd, got {value!r}")
            return value

    with pytest.raises(DeepSpeedConfigError) as info:
        DeepSpeedConfig({"train_batch_size": 8, "feature": {"knob": 4}},
                        sections={"feature": Odd}, world_size=1)
    message = str(info.value)
    assert "feature.knob: must be odd, got 4" in message and message.count("got 4") == 1


def test_union_member_tags_do_not_leak_into_paths():
    with pytest.raises(DeepSpeedConfigError) as info:
        DeepSpeedConfig({"train_batch_size": 8, "zero_optimization": {"zenflow": {"select_interval": "often"}}},
                        sections=ZERO, world_size=1)
    assert "zero_optimization.zenflow.select_interval: Input should be 'auto'" in str(info.value)
    assert "literal" not in str(info.value)


def test_top_level_typo_suggests_plugin_sections_too():
    with pytest.raises(DeepSpeedConfigError, match="did you mean 'zero_optimization'"):
        DeepSpeedConfig({"train_batch_size": 8, "zero_optimisation": {}}, sections=ZERO, world_size=1)


def test_plugin_section_with_non_model_type():
    config = DeepSpeedConfig({"train_batch_size": 8, "sequence_parallel_size": 2.0},
                             sections={"sequence_parallel_size": int}, world_size=1)
    assert config.section("sequence_parallel_size") == 2


def test_plugin_section_may_not_shadow_a_core_key():
    with pytest.raises(ValueError, match="collides with the core config key 'fp16'"):
        DeepSpeedConfig({"train_batch_size": 8}, sections={"fp16": ZeroSection}, world_size=1)


@pytest.mark.parametrize("key", ["zero_optimization", "tensorboard", "flops_profiler", "comms_logger",
                                 "autotuning", "pipeline", "sparse_attention", "aio"])
def test_documented_feature_key_without_plugin(key):
    assert key in FEATURE_SECTIONS
    with pytest.raises(DeepSpeedConfigError) as info:
        DeepSpeedConfig({"train_batch_size": 8, key: {"enabled": True}}, sections={},
                        world_size=1)
    message = str(info.value)
    assert f"'{key}' is a DeepSpeed config section, but no installed plugin provides it" in message
    assert "did you mean" not in message


def test_feature_keys_are_not_core_models():
    from deepspeed.config import CoreConfig
    assert not set(FEATURE_SECTIONS) & set(CoreConfig.model_fields)


def test_section_lookup_of_unknown_key():
    config = DeepSpeedConfig({"train_batch_size": 8}, world_size=1)
    assert config.section("fp16") is None and not config.has_section("fp16")
    assert config.section("tensorboard") is None
    with pytest.raises(KeyError, match="nonsense"):
        config.section("nonsense")


# -- leftover "auto" -------------------------------------------------------------------------------
def test_leftover_auto_paths_are_all_named():
    with pytest.raises(DeepSpeedConfigError) as info:
        DeepSpeedConfig(DOC_EXAMPLES / "hf_zero3_auto.json", sections=ZERO_PERMISSIVE, world_size=2)
    message = str(info.value)
    expected = ["fp16.enabled", "optimizer.params.lr", "optimizer.params.betas", "optimizer.params.eps",
                "optimizer.params.weight_decay", "scheduler.params.warmup_min_lr",
                "scheduler.params.warmup_max_lr", "scheduler.params.warmup_num_steps",
                "zero_optimization.reduce_bucket_size", "zero_optimization.stage3_prefetch_bucket_size",
                "zero_optimization.stage3_param_persistence_threshold", "gradient_accumulation_steps",
                "gradient_clipping", "train_batch_size", "train_micro_batch_size_per_gpu"]
    for path in expected:
        assert f"  - {path}: still set to \"auto\"" in message
    assert f"{len(expected)} problems" in message
    assert "Hugging Face Trainer" in message and "Accelerate" in message


ZERO_PERMISSIVE = {"zero_optimization": PermissiveSection}


def test_hf_doc_config_after_filling_auto_validates():
    """What the HF Trainer does: replace every "auto", then hand the dict to DeepSpeed."""
    raw = load_config_source(DOC_EXAMPLES / "hf_zero3_auto.json")
    hidden = 16
    raw["fp16"]["enabled"] = False
    raw["optimizer"]["params"].update(lr=1e-3, betas=[0.9, 0.999], eps=1e-8, weight_decay=0.01)
    raw["scheduler"]["params"].update(warmup_min_lr=0, warmup_max_lr=1e-3, warmup_num_steps=10)
    raw["zero_optimization"].update(reduce_bucket_size=hidden * hidden,
                                    stage3_prefetch_bucket_size=int(0.9 * hidden * hidden),
                                    stage3_param_persistence_threshold=10 * hidden)
    raw.update(gradient_accumulation_steps=3, gradient_clipping=1.0, train_batch_size=24,
               train_micro_batch_size_per_gpu=4)
    config = DeepSpeedConfig(raw, sections=ZERO_PERMISSIVE, world_size=2)
    assert (config.train_batch_size, config.train_micro_batch_size_per_gpu,
            config.gradient_accumulation_steps) == (24, 4, 3)
    assert config.section("zero_optimization").stage == 3 and config.steps_per_print == 2000
    resolved = config.to_dict()
    assert '"auto"' not in json.dumps(resolved)
    assert resolved["zero_optimization"]["stage3_prefetch_bucket_size"] == 230


def test_auto_is_fine_where_a_field_accepts_it():
    config = DeepSpeedConfig({"train_batch_size": 8, "zero_optimization": {
        "zenflow": {"select_strategy": "auto", "select_interval": "auto"}, "mode": "auto"}},
        sections=ZERO, world_size=1)
    assert config.section("zero_optimization").zenflow.select_interval == "auto"


def test_auto_and_typos_are_reported_together():
    with pytest.raises(DeepSpeedConfigError) as info:
        DeepSpeedConfig({"train_batch_size": "auto", "fp16": {"enabld": True}, "zero_optimization": {
            "stage": "auto", "zenflow": {"topk_ratio": "auto"}}}, sections=ZERO, world_size=1)
    message = str(info.value)
    for fragment in ['train_batch_size: still set to "auto"', 'zero_optimization.stage: still set to "auto"',
                     'zero_optimization.zenflow.topk_ratio: still set to "auto"',
                     "fp16.enabld: unknown key; did you mean 'fp16.enabled'?"]:
        assert fragment in message


# -- printing --------------------------------------------------------------------------------------
class _Records(logging.Handler):
    def __init__(self):
        super().__init__()
        self.records = []

    def emit(self, record):
        self.records.append(record.getMessage())


@pytest.fixture
def log_records():
    from deepspeed.utils.logging import logger
    handler = _Records()
    logger.addHandler(handler)
    yield handler.records
    logger.removeHandler(handler)


def test_print_full_logs_every_resolved_key_once_on_rank_zero(monkeypatch, log_records):
    monkeypatch.setenv("RANK", "0")
    config = DeepSpeedConfig(CONFIG, sections=ZERO, world_size=2)
    config.print("TestEngine", full=True)
    assert len(log_records) == 1
    lines = log_records[0].splitlines()
    assert "TestEngine configuration:" in lines[0]
    body = lines[1:]
    keys = [key for key, _ in flatten(config.to_dict())]
    assert len(body) == len(keys)
    for key, value in flatten(config.to_dict()):
        matching = [line for line in body if line.split()[0] == key]
        assert len(matching) == 1
        assert matching[0].endswith(f" {value}") and " ..." in matching[0]
    assert any(line.split()[0] == "train_batch_size" and line.endswith(" 24") for line in body)
    assert not any(line.endswith(" auto") for line in body)


def _printed(records):
    assert len(records) == 1
    lines = records[0].splitlines()
    return lines[0], {line.split()[0]: line.split()[-1] for line in lines[1:]}


def test_print_by_default_lists_only_the_keys_that_differ_from_their_defaults(monkeypatch,
                                                                              log_records):
    monkeypatch.setenv("RANK", "0")
    config = DeepSpeedConfig(dict(CONFIG, zero_optimization={"stage": 2},
                                  gradient_accumulation_steps=1), sections=ZERO, world_size=2)
    config.print("TestEngine")
    title, shown = _printed(log_records)
    assert "differ from their defaults" in title and "dump_state" in title
    assert shown["gradient_clipping"] == "1.0" and shown["zero_optimization.stage"] == "2"
    assert shown["optimizer.params.lr"] == "3e-05" and shown["train_batch_size"] == "8"
    # equal to the default although written by the user, or never written: not listed
    for key in ("gradient_accumulation_steps", "zero_optimization.reduce_bucket_size",
                "amp.enabled", "fp16.hysteresis", "fp16.initial_scale_power", "dump_state"):
        assert key not in shown, key
    assert len(shown) < len(list(flatten(config.to_dict()))) / 2


def test_print_names_a_section_given_with_only_default_values(monkeypatch, log_records):
    monkeypatch.setenv("RANK", "0")
    DeepSpeedConfig({"train_batch_size": 2, "zero_optimization": {"stage": 0}}, sections=ZERO,
                    world_size=1).print()
    _, shown = _printed(log_records)
    assert shown == {"train_batch_size": "2", "train_micro_batch_size_per_gpu": "2",
                     "zero_optimization": "(defaults)"}


@pytest.mark.parametrize("how", ["dump_state", "debug"])
def test_print_lists_every_key_with_dump_state_or_at_debug_level(monkeypatch, log_records, how):
    from deepspeed.utils.logging import logger

    monkeypatch.setenv("RANK", "0")
    config = dict(CONFIG, dump_state=how == "dump_state")
    built = DeepSpeedConfig(config, sections=ZERO, world_size=2)
    level = logger.level
    logger.setLevel(logging.DEBUG if how == "debug" else level)
    try:
        built.print()
    finally:
        logger.setLevel(level)
    _, shown = _printed(log_records)
    assert set(shown) == {key for key, _ in flatten(built.to_dict())}


def test_print_is_silent_on_other_ranks(monkeypatch, log_records):
    monkeypatch.setenv("RANK", "1")
    DeepSpeedConfig(CONFIG, world_size=2).print()
    assert log_records == []


def test_infinite_steps_per_print_means_never_and_the_dict_face():
    """Accelerate writes steps_per_print=inf and reads engine.config like the dict it passed."""
    config = DeepSpeedConfig({"train_batch_size": 8, "steps_per_print": float("inf")},
                             sections={}, world_size=1)
    assert config.steps_per_print is None
    assert config.get("train_batch_size") == 8 and config.get("absent", 3) == 3
    assert "train_batch_size" in config and config["train_batch_size"] == 8
