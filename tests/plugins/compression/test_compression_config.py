"""Both sections through the engine's config validation: documented spellings load, bad values
fail naming the key, keys without effect are reported."""
import logging

import pytest
from cp_helpers import section, tiny_bert

from deepspeed.compression.compress import init_compression
from deepspeed.config import DeepSpeedConfig, DeepSpeedConfigError
from deepspeed.config.without_effect import reset_without_effect_warnings

BASE = {"train_micro_batch_size_per_gpu": 1}

# the MoQ tutorial's test.json tail, verbatim (hyphenated key and trailing comma included)
MOQ_TEXT = """{
  "train_micro_batch_size_per_gpu": 1,
  "quantize_training": {
    "enabled": true,
    "quantize_verbose": true,
    "quantizer_kernel": true,
    "quantize-algo": {
      "q_type": "symmetric"
    },
    "quantize_bits": {
      "start_bits": 16,
      "target_bits": 8
    },
    "quantize_schedule": {
      "quantize_period": 400,
      "schedule_offset": 0
    },
    "quantize_groups": 8,
  }
}"""


def _config(extra):
    return DeepSpeedConfig({**BASE, **extra}, world_size=1)


def test_moq_tutorial_config_loads(tmp_path):
    path = tmp_path / "test.json"
    path.write_text(MOQ_TEXT)
    moq = DeepSpeedConfig(str(path), world_size=1).section("quantize_training")
    assert moq.enabled and moq.quantize_groups == 8 and moq.quantize_algo.q_type == "symmetric"
    assert (moq.quantize_bits.start_bits, moq.quantize_bits.target_bits) == (16, 8)
    assert moq.quantize_schedule.quantize_period == 400
    plain = _config({"quantize_training": {"quantize_algo": {"q_type": "asymmetric"}}})
    assert plain.section("quantize_training").quantize_algo.q_type == "asymmetric"


def test_keys_without_effect_are_warned(caplog):
    reset_without_effect_warnings()
    with caplog.at_level(logging.WARNING):
        _config({"quantize_training": {"enabled": True, "quantizer_kernel": True}})
    assert any("quantize_training.quantizer_kernel" in r.getMessage() and
               "no CUDA quantizer kernel" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("bad, key", [
    ({"weight_quantization": {"different_groups": {"wq1": {"params": {"start_bits": 9}}}}},
     "start_bits"),
    ({"weight_quantization": {"different_groups": {"wq1": {"params": {"target_bits": 0}}}}},
     "target_bits"),
    ({"activation_quantization": {"different_groups": {"aq1": {"params": {"bits": 12}}}}},
     "bits"),
    ({"sparse_pruning": {"different_groups": {"sp1": {"params": {"dense_ratio": 0}}}}},
     "dense_ratio"),
    ({"row_pruning": {"different_groups": {"rp1": {"params": {"dense_ratio": 1.5}}}}},
     "dense_ratio"),
    ({"head_pruning": {"shared_parameters": {"enabled": True}}}, "num_heads"),
    ({"layer_reduction": {"enabled": True, "module_name_prefix": "x", "keep_number_layer": 2,
                          "teacher_layer": [1]}}, "teacher_layer"),
    ({"sparse_pruning": {"shared_parameters": {"method": "magnitude"}}}, "method"),
    ({"sparse_pruning": {"shared_parameters": {"block_pattern": "4by1"}}}, "block_pattern"),
    ({"sparse_pruning": {"shared_parameters": {"block_pattern": "4:2"}}}, "block_pattern"),
    ({"weight_quantization": {"shared_parameters": {"quantize_grups": 2}}}, "quantize_grups"),
])
def test_bad_values_fail_naming_the_key(bad, key):
    with pytest.raises(DeepSpeedConfigError, match=key) as info:
        _config({"compression_training": bad})
    assert "compression_training" in str(info.value)
    with pytest.raises(DeepSpeedConfigError, match=key):  # init_compression validates alike
        init_compression(tiny_bert(), {"compression_training": bad})


def test_moq_bits_out_of_range():
    with pytest.raises(DeepSpeedConfigError, match="quantize_training.quantize_bits.start_bits"):
        _config({"quantize_training": {"quantize_bits": {"start_bits": 17}}})
    with pytest.raises(DeepSpeedConfigError, match="above start_bits"):
        _config({"quantize_training": {"quantize_bits": {"start_bits": 4, "target_bits": 8}}})


def test_enabled_technique_without_groups_or_section_is_refused():
    with pytest.raises(ValueError, match="compression_training.row_pruning is enabled but "
                                         "different_groups is empty"):
        init_compression(tiny_bert(), section(row_pruning=({}, {})))
    with pytest.raises(DeepSpeedConfigError, match="no 'compression_training' section"):
        init_compression(tiny_bert(), {"train_batch_size": 1})
