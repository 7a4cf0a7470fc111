"""``deepspeed.inference.config.DeepSpeedInferenceConfig``: the config of ``init_inference``.

Every documented field with its documented default and alias. The inference config is not a
section of the training config: it is the whole config of one ``init_inference`` call, built
from a dict, a JSON file path, keyword arguments, or a dict and keyword arguments together
(``merge_config``: the same key with two different values is a ``ValueError``).

The value ``"auto"`` is dropped for every key but ``replace_method`` (Hugging Face writes it for
keys it would fill in), so the field keeps its default. The deprecated top-level keys
(``mp_size``, ``mpu``, ``ep_size``, ``ep_group``, ``ep_mp_group``, ``moe_experts``, ``moe_type``)
move into ``tensor_parallel`` / ``moe``; giving one together with its replacement is an error.
"""
import json
import os
from enum import Enum
from typing import Any, Dict, Optional, Union

import torch
from pydantic import AliasChoices, Field, field_validator, model_validator

from deepspeed.config.model import DeepSpeedConfigModel

AUTO = "auto"
TESTS = "tests/plugins/inference/"  # the test paths of the key-effect table
KEY_TESTS = TESTS + "test_inference_key_effects.py::"


class DtypeEnum(Enum):
    """The dtypes ``init_inference`` accepts, each with its spellings."""

    fp16 = (torch.float16, "torch.float16", "fp16", "float16", "half")
    fp32 = (torch.float32, "torch.float32", "fp32", "float32", "float")
    bf16 = (torch.bfloat16, "torch.bfloat16", "bf16", "bfloat16", "bfloat")
    int8 = (torch.int8, "torch.int8", "int8")

    @classmethod
    def from_value(cls, value):
        if isinstance(value, cls):
            return value
        for member in cls:
            if value in member.value:
                return member
        spellings = [str(v) for m in cls for v in m.value[1:]]
        raise ValueError(f"dtype {value!r} is not supported by init_inference; use one of "
                         f"torch.float16, torch.float32, torch.bfloat16, torch.int8 or "
                         f"{', '.join(spellings)}")

    @property
    def torch_dtype(self):
        return self.value[0]


class MoETypeEnum(str, Enum):
    residual = "residual"
    standard = "standard"


class DeepSpeedTPConfig(DeepSpeedConfigModel):
    """``tensor_parallel`` (alias ``tp``)."""

    tested_by = {
        "enabled": KEY_TESTS + "test_tensor_parallel_enabled_false_splits_nothing",
        "tp_size": TESTS + "test_inference_autotp.py::test_tp2_equals_single_process",
        **dict.fromkeys(("mpu", "tp_group"),
                        KEY_TESTS + "test_tensor_parallel_group_comes_from_tp_group_or_mpu"),
    }

    enabled: bool = True
    tp_size: int = Field(1, ge=1)
    mpu: Any = None
    tp_group: Any = None


class DeepSpeedMoEConfig(DeepSpeedConfigModel):
    tested_by = {
        "enabled": KEY_TESTS + "test_moe_enabled_false_asks_for_no_expert_parallelism",
        "ep_size": TESTS + "test_inference_moe.py::test_moe_settings_errors",
        "moe_experts": TESTS + "test_inference_moe.py::test_moe_settings_errors",
        "type": TESTS + "test_inference_moe.py::test_moe_settings_errors",
    }
    without_effect = dict.fromkeys(
        ("ep_group", "ep_mp_group"),
        "the expert-parallel groups are the ones the deepspeed.moe.layer.MoE layers built "
        "(MoE(..., ep_size=...)); build the layers with the grouping you want")

    enabled: bool = True
    ep_size: int = Field(1, ge=1)
    moe_experts: list = Field([1], validation_alias=AliasChoices("moe_experts", "num_experts",
                                                                 "numExperts"))
    type: MoETypeEnum = MoETypeEnum.standard
    ep_mp_group: Any = None
    ep_group: Any = Field(None, alias="expert_group")


class QuantTypeEnum(str, Enum):
    asym = "asymmetric"
    sym = "symmetric"


class BaseQuantConfig(DeepSpeedConfigModel):
    enabled: bool = True
    num_bits: int = 8
    q_type: QuantTypeEnum = QuantTypeEnum.sym
    q_groups: int = 1


class WeightQuantConfig(BaseQuantConfig):
    tested_by = {
        "enabled": KEY_TESTS + "test_activation_quantization_quantizes_each_layer_input",
        "num_bits": TESTS + "test_inference_int8.py::test_bad_quant_settings_name_the_key",
        "q_type": KEY_TESTS + "test_weight_q_type_asymmetric_keeps_zero_points",
        "q_groups": KEY_TESTS + "test_weight_q_groups_gives_a_scale_per_group",
    }
    without_effect = dict.fromkeys(
        ("quantized_initialization", "post_init_quant"),
        "dtype=torch.int8 quantizes every Linear-like layer's weight after loading, with one "
        "setting (quant.weight); per-layer tables are not read: exclude layers with "
        "quant.qkv or keep them float with a separate model part")

    quantized_initialization: Dict = {}
    post_init_quant: Dict = {}


class ActivationQuantConfig(BaseQuantConfig):
    """``quant.activation``: each quantized layer's input, quantized per token on the fly."""

    tested_by = dict.fromkeys(("enabled", "num_bits", "q_type", "q_groups"),
                              KEY_TESTS + "test_activation_quantization_quantizes_each_layer_input")


class QKVQuantConfig(DeepSpeedConfigModel):
    tested_by = {"enabled": KEY_TESTS + "test_qkv_off_leaves_the_attention_projections_in_float"}

    enabled: bool = True


class QuantizationConfig(DeepSpeedConfigModel):
    tested_by = {"enabled": KEY_TESTS + "test_activation_quantization_quantizes_each_layer_input"}

    enabled: bool = True
    activation: ActivationQuantConfig = Field(default_factory=ActivationQuantConfig)
    weight: WeightQuantConfig = Field(default_factory=WeightQuantConfig)
    qkv: QKVQuantConfig = Field(default_factory=QKVQuantConfig)


class InferenceCheckpointConfig(DeepSpeedConfigModel):
    """``checkpoint_config`` (alias ``ckpt_config``): the checkpoint keys grouped; the
    top-level ``checkpoint`` / ``base_dir`` / ``save_mp_checkpoint_path`` win when given."""

    tested_by = dict.fromkeys(
        ("checkpoint_dir", "base_dir", "save_mp_checkpoint_path"),
        KEY_TESTS + "test_checkpoint_config_names_the_checkpoint_and_its_directory")

    checkpoint_dir: Optional[str] = None
    save_mp_checkpoint_path: Optional[str] = None
    base_dir: Optional[str] = None


# deprecated top-level key -> (sub-config field, key inside it)
_MOVED = {
    "mp_size": ("tensor_parallel", "tp_size"),
    "mpu": ("tensor_parallel", "mpu"),
    "ep_size": ("moe", "ep_size"),
    "ep_group": ("moe", "ep_group"),
    "expert_group": ("moe", "ep_group"),
    "ep_mp_group": ("moe", "ep_mp_group"),
    "expert_mp_group": ("moe", "ep_mp_group"),
    "moe_experts": ("moe", "moe_experts"),
    "moe_type": ("moe", "type"),
}
_SUB_ALIASES = {"tensor_parallel": ("tensor_parallel", "tp"), "moe": ("moe",)}


class DeepSpeedInferenceConfig(DeepSpeedConfigModel):
    """The documented ``init_inference`` fields (``deepspeed.inference.config``)."""

    # what each key does here (see deepspeed.config.model); the deprecated top-level keys
    # (mp_size, ep_size, ...) move into tensor_parallel / moe and share their rows' effects
    tested_by = {
        "replace_with_kernel_inject": TESTS + "test_inference_kernel_inject.py::"
                                              "test_cpu_falls_back_with_one_log_line",
        "dtype": TESTS + "test_inference_config.py::test_explicit_dtypes_convert_and_kwargs_reach_"
                     "the_module",
        "enable_cuda_graph": TESTS + "test_inference_cuda_graph.py::test_refused_without_cuda",
        "use_triton": KEY_TESTS + "test_use_triton_needs_kernel_injection_and_a_cuda_device",
        "zero": KEY_TESTS + "test_zero_inference_partitions_the_parameters_and_computes_the_same",
        "checkpoint": TESTS + "test_inference_checkpoint.py::test_descriptor_dict_and_deepspeed_"
                          "module_file_single_process",
        "base_dir": TESTS + "test_inference_checkpoint.py::test_base_dir_resolves_the_"
                            "descriptors_relative_files",
        "set_empty_params": KEY_TESTS + "test_set_empty_params_takes_every_weight_from_the_"
                                        "checkpoint",
        "save_mp_checkpoint_path": TESTS + "test_inference_checkpoint.py::test_save_mp_checkpoint_"
                                       "path_writes_the_split_model_which_loads_at_any_tp_size",
        "training_mp_size": TESTS + "test_inference_checkpoint.py::test_megatron_checkpoint_"
                                "merges_its_tensor_parallel_ranks",
        "injection_policy": KEY_TESTS + "test_injection_policy_names_the_row_parallel_layers",
        "injection_policy_tuple": TESTS + "test_inference_autotp.py::test_injection_policy_"
                                          "tuple_splits_a_block_autotp_cannot_parse",
        "max_out_tokens": TESTS + "test_inference_config.py::test_generate_passthrough_and_max_out_"
                              "tokens",
        "min_out_tokens": KEY_TESTS + "test_min_out_tokens_must_fit_within_max_out_tokens",
        "mp_size": TESTS + "test_inference_config.py::test_deprecated_keys_move_to_their_"
                       "replacements",
        "mpu": KEY_TESTS + "test_tensor_parallel_group_comes_from_tp_group_or_mpu",
        "ep_size": TESTS + "test_inference_moe.py::test_moe_settings_errors",
        "moe_experts": TESTS + "test_inference_config.py::test_deprecated_keys_move_to_their_"
                           "replacements",
        "moe_type": TESTS + "test_inference_config.py::test_deprecated_keys_move_to_their_"
                        "replacements",
    }
    without_effect = {
        "triton_autotune": "the Triton kernels of this build (use_triton) run with fixed block "
                           "sizes; there is nothing to autotune",
        "triangular_masking": "kernel injection keeps each model's own attention masking (SDPA "
                              "with the mask the model builds); the mask is not switched here",
        "return_tuple": "kernel injection keeps the model's own transformer layers, which "
                        "return what they always return",
        "replace_method": "deprecated upstream; the layers to split are found by AutoTP or "
                          "named by injection_policy",
        "transposed_mode": "no injected kernel of this build takes transposed weights; the "
                           "layers keep torch's layout",
        "config": "the model's configuration is read from the model itself (model.config)",
        "ep_group": "the expert-parallel groups are the ones the deepspeed.moe.layer.MoE layers "
                    "built (MoE(..., ep_size=...))",
        "ep_mp_group": "the expert-parallel groups are the ones the deepspeed.moe.layer.MoE "
                       "layers built (MoE(..., ep_size=...))",
    }

    replace_with_kernel_inject: bool = Field(False, alias="kernel_inject")
    dtype: DtypeEnum = DtypeEnum.fp16
    tensor_parallel: DeepSpeedTPConfig = Field(default_factory=DeepSpeedTPConfig, alias="tp")
    enable_cuda_graph: bool = False
    use_triton: bool = False
    triton_autotune: bool = False
    zero: Dict = {}
    triangular_masking: bool = Field(True, alias="tm")
    moe: Union[bool, DeepSpeedMoEConfig] = Field(default_factory=DeepSpeedMoEConfig)
    quant: QuantizationConfig = Field(default_factory=QuantizationConfig)
    checkpoint: Optional[Union[str, Dict]] = None
    base_dir: str = ""
    set_empty_params: bool = False
    save_mp_checkpoint_path: Optional[str] = None
    checkpoint_config: InferenceCheckpointConfig = Field(
        default_factory=InferenceCheckpointConfig, alias="ckpt_config")
    return_tuple: bool = True
    training_mp_size: int = 1
    replace_method: str = "auto"
    injection_policy: Optional[Dict] = Field(None, alias="injection_dict")
    injection_policy_tuple: Optional[tuple] = None
    config: Optional[Dict] = Field(None, alias="args")
    max_out_tokens: int = Field(1024, alias="max_tokens")
    min_out_tokens: int = Field(1, alias="min_tokens")
    transposed_mode: bool = False
    # deprecated: kept readable, moved into tensor_parallel / moe by the validator below
    mp_size: int = Field(1, json_schema_extra={"deprecated": True})
    mpu: Any = None
    ep_size: int = 1
    ep_group: Any = Field(None, alias="expert_group")
    ep_mp_group: Any = Field(None, alias="expert_mp_group")
    moe_experts: list = [1]
    moe_type: MoETypeEnum = MoETypeEnum.standard

    @model_validator(mode="before")
    @classmethod
    def _drop_auto_and_move_deprecated(cls, data):
        if not isinstance(data, dict):
            return data
        data = {k: v for k, v in data.items() if not (k != "replace_method" and
                                                      isinstance(v, str) and v == AUTO)}
        for old, (section, key) in _MOVED.items():
            if old not in data:
                continue
            names = _SUB_ALIASES[section]
            present = [n for n in names if n in data]
            sub = data[present[0]] if present else {}
            if isinstance(sub, DeepSpeedConfigModel):
                sub = sub.to_dict() if section == "tensor_parallel" else sub.model_dump()
            if isinstance(sub, bool):  # moe: True/False
                sub = {"enabled": sub}
            sub = dict(sub)
            if key in sub:
                raise AssertionError(f"Cannot provide deprecated parameter '{old}' and replacing "
                                     f"parameter '{section}.{key}' together")
            sub[key] = data[old]
            for n in present:
                data.pop(n)
            data[section] = sub
        return data

    @field_validator("dtype", mode="before")
    @classmethod
    def _dtype(cls, value):
        return DtypeEnum.from_value(value)

    @field_validator("moe", mode="before")
    @classmethod
    def _moe(cls, value):
        if isinstance(value, bool):
            return DeepSpeedMoEConfig(enabled=value)
        return value

    @field_validator("use_triton")
    @classmethod
    def _triton(cls, value):
        if value:
            import importlib.util
            if importlib.util.find_spec("triton") is None:
                raise ValueError("use_triton=True needs the 'triton' package, which is not "
                                 "installed (pip install triton)")
        return value


def load_config(config):
    """A dict from ``config``: a dict, a JSON file path, or None."""
    if config is None:
        return {}
    if isinstance(config, (str, os.PathLike)):
        with open(config) as handle:
            return json.load(handle)
    if isinstance(config, dict):
        return dict(config)
    raise ValueError(f"'config' argument expected string or dictionary, got {type(config)}")


def merge_config(config, kwargs):
    """``config`` (dict / JSON path / None) and ``init_inference`` keyword arguments in one
    dict; a key given both ways must have the same value."""
    merged = load_config(config)
    for key, value in kwargs.items():
        if key in merged and not _same(merged[key], value):
            raise ValueError(f"Conflicting argument '{key}' in 'config':{merged[key]!r} and "
                             f"kwargs:{value!r}; give it once, or the same value both ways")
        merged[key] = value
    return merged


def _same(a, b):
    try:
        return bool(a == b)
    except Exception:
        return a is b
