"""The config sections this plugin owns: ``compression_training`` (the compression library) and
``quantize_training`` (mixture-of-quantization, MoQ).

Defaults are DeepSpeed's. Each technique of ``compression_training`` has ``shared_parameters``
(switch and schedule) and ``different_groups`` (user-named groups ``wq1``, ``sp1`` ... each with
``params``, the module-name patterns ``modules`` and, for structured pruning, the
``related_modules`` whose matching dimension shrinks with them). Values that cannot work are
refused here, naming the key: bits outside 1..8 (or 16 for "off"), a dense_ratio outside (0, 1],
head pruning without ``num_heads``, layer reduction without its layer lists.
"""
from typing import Dict, List, Literal, Optional

from pydantic import Field, field_validator, model_validator

from deepspeed.config import DeepSpeedConfigModel

DenseRatio = Field(0.5, gt=0, le=1, description="fraction of weights kept, in (0, 1]")


def _check_bits(value, key):
    if not (1 <= value <= 8 or value == 16):
        raise ValueError(f"{key} must be 1..8, or 16 for not quantized")
    return value


# ------------------------------------------------------------------ layer reduction

# the tests named in the key-effect table (``tested_by``, see deepspeed.config.model)
_T = "tests/plugins/compression/"
INIT, CLEAN = _T + "test_init_compression.py::", _T + "test_redundancy_clean.py::"
ENGINE, MOQ = _T + "test_compression_engine.py::", _T + "test_moq.py::"
EIGEN = _T + "test_moq_eigenvalue.py::"
SNIP, KEYS = _T + "test_snip.py::", _T + "test_compression_keys.py::"
PRUNING = KEYS + "test_pruning_groups_choose_method_ratio_modules_and_offset"

class LayerReductionConfig(DeepSpeedConfigModel):
    tested_by = dict.fromkeys(
        ("enabled", "keep_number_layer", "module_name_prefix", "teacher_layer",
         "other_module_name"),
        CLEAN + "test_layer_reduction_copies_the_chosen_teacher_layers")

    enabled: bool = False
    keep_number_layer: Optional[int] = Field(None, ge=1)
    module_name_prefix: str = ""
    teacher_layer: List[int] = Field(default_factory=list)
    other_module_name: List[str] = Field(default_factory=list)

    @model_validator(mode="after")
    def _layers(self):
        if not self.enabled:
            return self
        if not self.module_name_prefix:
            raise ValueError("layer_reduction.module_name_prefix is required when enabled (the "
                             "name of the ModuleList of layers, e.g. 'bert.encoder.layer')")
        if self.keep_number_layer is None:
            raise ValueError("layer_reduction.keep_number_layer is required when enabled")
        if len(self.teacher_layer) != self.keep_number_layer:
            raise ValueError(f"layer_reduction.teacher_layer lists {len(self.teacher_layer)} "
                             f"layers but keep_number_layer is {self.keep_number_layer}: give "
                             f"one teacher layer index per kept student layer")
        return self


# ------------------------------------------------------------------ shared groups
class _Group(DeepSpeedConfigModel):
    tested_by = {"modules": INIT + "test_patterns_select_layers_and_leave_others_alone"}
    modules: List[str] = Field(default_factory=lambda: ["*"])
    related_modules: Optional[List[List[str]]] = None


class WeightQuantParams(DeepSpeedConfigModel):
    tested_by = dict.fromkeys(("start_bits", "target_bits", "quantization_period"),
                              INIT + "test_weight_bits_follow_the_schedule")

    start_bits: int = 8
    target_bits: int = 8
    quantization_period: int = Field(1, ge=1)

    @field_validator("start_bits", "target_bits")
    @classmethod
    def _bits(cls, value, info):
        return _check_bits(value, info.field_name)

    @model_validator(mode="after")
    def _order(self):
        if self.target_bits > self.start_bits:
            raise ValueError(f"weight_quantization params.target_bits ({self.target_bits}) is "
                             f"above start_bits ({self.start_bits}): bits only step down")
        return self


_UNRELATED = ("related modules are only shrunk with the layer by structured pruning (row, head, "
              "channel), by redundancy_clean; this technique leaves them alone")


class WeightQuantGroup(_Group):
    without_effect = {"related_modules": _UNRELATED}

    params: WeightQuantParams = Field(default_factory=WeightQuantParams)


class FP16MixedQuantizeConfig(DeepSpeedConfigModel):
    tested_by = dict.fromkeys(("enabled", "quantize_change_ratio"),
                              MOQ + "test_fp16_mixed_quantize_blends_toward_quantized")

    enabled: bool = False
    quantize_change_ratio: float = Field(0.001, ge=0, le=1)


class WeightQuantShared(DeepSpeedConfigModel):
    tested_by = {
        **dict.fromkeys(("enabled", "schedule_offset"),
                        INIT + "test_weight_bits_follow_the_schedule"),
        **dict.fromkeys(("quantize_groups", "quantize_weight_in_forward"),
                        KEYS + "test_quantize_groups_and_quantize_weight_in_forward"),
        **dict.fromkeys(("quantization_type", "rounding"),
                        KEYS + "test_weight_quantization_type_and_rounding_choose_the_grid"),
    }

    without_effect = {
        "quantizer_kernel": "there is no CUDA quantizer kernel here; the torch quantizer runs on "
                            "every device",
        "quantize_verbose": "no per-step log is written; a layer's weight_bits (or the engine's "
                            "compression_scheduler) shows the bits in use",
        "fp16_mixed_quantize.enabled": "the compression library quantizes the weights fully; "
                                       "the fp16/quantized blend is implemented for "
                                       "quantize_training (MoQ) only",
    }
    enabled: bool = False
    quantizer_kernel: bool = False
    schedule_offset: int = Field(0, ge=0)
    quantize_groups: int = Field(1, ge=1)
    quantize_verbose: bool = False
    quantization_type: Literal["symmetric", "asymmetric"] = "symmetric"
    rounding: Literal["nearest", "stochastic"] = "nearest"
    quantize_weight_in_forward: bool = False
    fp16_mixed_quantize: FP16MixedQuantizeConfig = Field(default_factory=FP16MixedQuantizeConfig)


class WeightQuantizationConfig(DeepSpeedConfigModel):
    shared_parameters: WeightQuantShared = Field(default_factory=WeightQuantShared)
    different_groups: Dict[str, WeightQuantGroup] = Field(default_factory=dict)


class ActQuantParams(DeepSpeedConfigModel):
    tested_by = {"bits": INIT + "test_conv_and_activation_quantization"}

    bits: int = 8

    @field_validator("bits")
    @classmethod
    def _bits(cls, value):
        return _check_bits(value, "bits")


class ActQuantGroup(_Group):
    tested_by = {"modules": INIT + "test_conv_and_activation_quantization"}
    without_effect = {"related_modules": _UNRELATED}

    params: ActQuantParams = Field(default_factory=ActQuantParams)


class ActQuantShared(DeepSpeedConfigModel):
    tested_by = {
        "enabled": INIT + "test_conv_and_activation_quantization",
        **dict.fromkeys(("range_calibration", "schedule_offset"),
                        KEYS + "test_activation_range_calibration_and_schedule_offset"),
        "quantization_type": KEYS + "test_activation_quantization_type_chooses_the_grid",
    }

    enabled: bool = False
    quantization_type: Literal["symmetric", "asymmetric"] = "symmetric"
    range_calibration: Literal["dynamic", "static"] = "static"
    schedule_offset: int = Field(0, ge=0)


class ActivationQuantizationConfig(DeepSpeedConfigModel):
    shared_parameters: ActQuantShared = Field(default_factory=ActQuantShared)
    different_groups: Dict[str, ActQuantGroup] = Field(default_factory=dict)


class DenseRatioParams(DeepSpeedConfigModel):
    tested_by = {"dense_ratio": PRUNING}

    dense_ratio: float = DenseRatio


class PruneGroup(_Group):
    """A structured (row, head, channel) pruning group: redundancy_clean shrinks its related
    modules with it."""

    tested_by = {"modules": PRUNING,
                 "related_modules": INIT + "test_related_modules_pair_with_their_module_pattern"}
    params: DenseRatioParams = Field(default_factory=DenseRatioParams)


class SparsePruneGroup(PruneGroup):
    """A ``sparse_pruning`` group: unstructured, so its related modules keep their shape."""

    tested_by = {"modules": PRUNING}
    without_effect = {"related_modules": _UNRELATED}


class SparsePruningShared(DeepSpeedConfigModel):
    tested_by = {
        "enabled": INIT + "test_l1_sparse_mask_keeps_exactly_the_largest_half",
        "schedule_offset": ENGINE + "test_engine_advances_the_compression_schedule",
        "method": INIT + "test_topk_sparse_mask_follows_learnable_scores",
        "dense_ratio": SNIP + "test_block_pattern_prunes_whole_blocks_down_to_the_ratio",
        "block_pattern": SNIP + "test_n_of_m_pattern_keeps_n_per_group",
        "schedule_offset_end": SNIP + "test_block_pattern_prunes_whole_blocks_down_to_the_ratio",
        "schedule_offset_stride": SNIP + "test_block_pattern_prunes_whole_blocks_down_to_the_"
                                         "ratio",
        "excluded_modules": INIT + "test_excluded_modules_are_not_pruned",
    }

    enabled: bool = False
    schedule_offset: int = Field(0, ge=0)
    schedule_offset_end: int = Field(0, ge=0)
    schedule_offset_stride: int = Field(1, ge=1)
    method: Literal["l1", "topk", "snip_momentum"] = "l1"
    block_pattern: str = "4x1"
    dense_ratio: float = Field(0.1, gt=0, le=1)
    excluded_modules: List[str] = Field(default_factory=list)

    @field_validator("block_pattern")
    @classmethod
    def _pattern(cls, value):
        from .snip import check_block_pattern
        check_block_pattern(value)
        return value


class SparsePruningConfig(DeepSpeedConfigModel):
    shared_parameters: SparsePruningShared = Field(default_factory=SparsePruningShared)
    different_groups: Dict[str, SparsePruneGroup] = Field(default_factory=dict)


class RowPruningShared(DeepSpeedConfigModel):
    tested_by = {
        "enabled": INIT + "test_row_head_and_channel_masks_have_the_documented_pattern",
        **dict.fromkeys(("method", "schedule_offset"), PRUNING),
    }

    enabled: bool = False
    schedule_offset: int = Field(0, ge=0)
    method: Literal["l1", "topk"] = "topk"


class RowPruningConfig(DeepSpeedConfigModel):
    shared_parameters: RowPruningShared = Field(default_factory=RowPruningShared)
    different_groups: Dict[str, PruneGroup] = Field(default_factory=dict)


class HeadPruningShared(DeepSpeedConfigModel):
    tested_by = {
        **dict.fromkeys(("enabled", "method", "num_heads"),
                        INIT + "test_row_head_and_channel_masks_have_the_documented_pattern"),
        "schedule_offset": PRUNING,
    }

    enabled: bool = False
    schedule_offset: int = Field(0, ge=0)
    method: Literal["topk"] = "topk"
    num_heads: Optional[int] = Field(None, ge=1)

    @model_validator(mode="after")
    def _heads(self):
        if self.enabled and self.num_heads is None:
            raise ValueError("num_heads is required when head pruning is enabled (the "
                             "attention's number of heads)")
        return self


class HeadPruningConfig(DeepSpeedConfigModel):
    shared_parameters: HeadPruningShared = Field(default_factory=HeadPruningShared)
    different_groups: Dict[str, PruneGroup] = Field(default_factory=dict)


class ChannelPruningShared(DeepSpeedConfigModel):
    tested_by = {
        "enabled": INIT + "test_row_head_and_channel_masks_have_the_documented_pattern",
        **dict.fromkeys(("method", "schedule_offset"), PRUNING),
    }

    enabled: bool = False
    schedule_offset: int = Field(0, ge=0)
    method: Literal["l1", "topk"] = "l1"


class ChannelPruningConfig(DeepSpeedConfigModel):
    shared_parameters: ChannelPruningShared = Field(default_factory=ChannelPruningShared)
    different_groups: Dict[str, PruneGroup] = Field(default_factory=dict)


class CompressionTrainingConfig(DeepSpeedConfigModel):
    """``compression_training``: the plugin is on when any technique is enabled."""

    layer_reduction: LayerReductionConfig = Field(default_factory=LayerReductionConfig)
    weight_quantization: WeightQuantizationConfig = Field(default_factory=WeightQuantizationConfig)
    activation_quantization: ActivationQuantizationConfig = Field(
        default_factory=ActivationQuantizationConfig)
    sparse_pruning: SparsePruningConfig = Field(default_factory=SparsePruningConfig)
    row_pruning: RowPruningConfig = Field(default_factory=RowPruningConfig)
    head_pruning: HeadPruningConfig = Field(default_factory=HeadPruningConfig)
    channel_pruning: ChannelPruningConfig = Field(default_factory=ChannelPruningConfig)

    @property
    def enabled(self):
        return self.layer_reduction.enabled or any(
            getattr(self, name).shared_parameters.enabled for name in TECHNIQUES)


#: the techniques that swap layers, in the order init_compression applies them
TECHNIQUES = ("weight_quantization", "activation_quantization", "sparse_pruning", "row_pruning",
              "head_pruning", "channel_pruning")


# ------------------------------------------------------------------ MoQ
class MoQBits(DeepSpeedConfigModel):
    tested_by = dict.fromkeys(("start_bits", "target_bits"),
                              MOQ + "test_offset_then_ternary_then_binary")

    start_bits: int = Field(16, ge=1, le=16)
    target_bits: int = Field(16, ge=1, le=16)

    @model_validator(mode="after")
    def _order(self):
        if self.target_bits > self.start_bits:
            raise ValueError(f"quantize_training.quantize_bits.target_bits ({self.target_bits}) "
                             f"is above start_bits ({self.start_bits}): bits only step down")
        return self


class MoQSchedule(DeepSpeedConfigModel):
    tested_by = dict.fromkeys(("quantize_period", "schedule_offset"),
                              MOQ + "test_offset_then_ternary_then_binary")

    quantize_period: int = Field(100, ge=1)
    schedule_offset: int = Field(100, ge=0)


class MoQAlgo(DeepSpeedConfigModel):
    tested_by = dict.fromkeys(("q_type", "rounding"), KEYS + "test_moq_type_rounding_and_groups")

    q_type: Literal["symmetric", "asymmetric"] = "symmetric"
    rounding: Literal["nearest", "stochastic"] = "nearest"


class EigenvalueConfig(DeepSpeedConfigModel):
    """Eigenvalue MoQ: each named layer's Hessian top eigenvalue stretches its quantization
    period at each bit drop by up to 5x (``deepspeed.compression.eigenvalue``)."""
    tested_by = {
        **dict.fromkeys(("enabled", "layer_name", "layer_num", "gas_boundary_resolution",
                         "verbose"), EIGEN + "test_sensitive_layers_get_longer_quantization_"
                                             "periods"),
        **dict.fromkeys(("max_iter", "tol", "stability"),
                        EIGEN + "test_max_iter_tol_and_stability_bound_the_iteration"),
    }

    enabled: bool = False
    verbose: bool = False
    max_iter: int = Field(100, ge=1)
    tol: float = 1e-2
    stability: float = 1e-6
    gas_boundary_resolution: int = Field(1, ge=1)
    layer_name: str = "bert.encoder.layer"
    layer_num: int = Field(0, ge=0)


class QuantizeTrainingConfig(DeepSpeedConfigModel):
    """``quantize_training`` (MoQ): after every optimizer step each weight matrix is replaced by
    its fake-quantized value at the current bits, which step down on the documented schedule."""
    tested_by = {
        "enabled": ENGINE + "test_moq_bits_step_down_on_schedule",
        "quantize_verbose": KEYS + "test_quantize_verbose_logs_each_moq_step",
        "quantize_type": KEYS + "test_moq_type_rounding_and_groups",
        "quantize_groups": KEYS + "test_moq_type_rounding_and_groups",
    }

    without_effect = {
        "quantizer_kernel": "there is no CUDA quantizer kernel here; the torch quantizer runs",
    }
    enabled: bool = False
    quantize_verbose: bool = False
    quantizer_kernel: bool = False
    quantize_type: Literal["symmetric", "asymmetric"] = "symmetric"
    quantize_groups: int = Field(1, ge=1)
    quantize_bits: MoQBits = Field(default_factory=MoQBits)
    quantize_schedule: MoQSchedule = Field(default_factory=MoQSchedule)
    quantize_algo: MoQAlgo = Field(default_factory=MoQAlgo, alias="quantize-algo")
    fp16_mixed_quantize: FP16MixedQuantizeConfig = Field(default_factory=FP16MixedQuantizeConfig)
    eigenvalue: EigenvalueConfig = Field(default_factory=EigenvalueConfig)
