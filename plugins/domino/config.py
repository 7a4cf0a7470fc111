"""The shape of a Domino transformer (Megatron's ``TransformerConfig`` field names) and the
tensor-parallel group it runs over.

Domino is a *model* feature (its layers replace a Megatron-style transformer's), so its knobs
are constructor arguments, not a training-config section: the transformer shape below, plus
``num_chunks`` (how many pieces the batch is cut into, 2 by default) and ``overlap`` on the
layers. A Megatron ``TransformerConfig`` (or any object or dict carrying these names) works
in place of a ``DominoConfig``.
"""
from typing import Optional

from pydantic import Field, model_validator

from deepspeed.config.model import DeepSpeedConfigModel

FIELDS = ("hidden_size", "num_attention_heads", "ffn_hidden_size", "num_layers",
          "layernorm_epsilon", "hidden_dropout", "attention_dropout", "causal")


class DominoConfig(DeepSpeedConfigModel):
    hidden_size: int = Field(..., ge=1)
    num_attention_heads: int = Field(..., ge=1)
    ffn_hidden_size: Optional[int] = Field(None, ge=1)  # None: 4 * hidden_size
    num_layers: int = Field(1, ge=1)
    layernorm_epsilon: float = Field(1e-5, gt=0)
    hidden_dropout: float = Field(0.0, ge=0, lt=1)
    attention_dropout: float = Field(0.0, ge=0, lt=1)
    causal: bool = True  # causal self-attention when no attention_mask is given

    @model_validator(mode="after")
    def _shapes(self):
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(f"hidden_size {self.hidden_size} is not a multiple of "
                             f"num_attention_heads {self.num_attention_heads}")
        if self.ffn_hidden_size is None:
            self.ffn_hidden_size = 4 * self.hidden_size
        return self

    @classmethod
    def coerce(cls, config):
        """A ``DominoConfig`` from one, a dict, or an object with Megatron's field names."""
        if isinstance(config, cls):
            return config
        if isinstance(config, dict):
            return cls(**config)
        values = {name: getattr(config, name) for name in FIELDS
                  if getattr(config, name, None) is not None}
        if "layernorm_epsilon" not in values and getattr(config, "layernorm_eps", None):
            values["layernorm_epsilon"] = config.layernorm_eps
        return cls(**values)


def tensor_parallel_unit(mpu=None):
    """The model-parallel unit Domino splits over: ``mpu`` when given, else the one the current
    topology answers from (``deepspeed.tensor_parallel.init_tensor_parallel_groups`` registers
    it). Domino only exists to hide tensor-parallel all-reduces, so no unit, or a
    tensor-parallel size of 1, is an error."""
    from deepspeed import comm as dist
    from deepspeed import topology

    how = ("call deepspeed.utils.groups.init_tensor_parallel_groups(tp_size) with tp_size > 1 "
           "(or pass mpu= with Megatron's get_tensor_model_parallel_* getters)")
    if not dist.is_initialized():
        raise RuntimeError(f"Domino needs tensor parallelism over the distributed backend: call "
                           f"deepspeed.init_distributed() first, then {how}")
    unit = mpu if mpu is not None else topology.current().unit
    if unit is None:
        raise RuntimeError(f"Domino overlaps tensor-parallel communication with compute, but no "
                           f"tensor parallelism is set up: {how}")
    size = _ask(unit, "get_tensor_model_parallel_world_size", "get_model_parallel_world_size")
    if size is None or size < 2:
        raise ValueError(f"Domino needs a tensor-parallel size of at least 2, got "
                         f"{size}: there is no tensor-parallel all-reduce to overlap; {how}, or "
                         f"use an ordinary transformer layer")
    return unit


def _ask(unit, *methods):
    for method in methods:
        if hasattr(unit, method):
            return getattr(unit, method)()
    return None


def tensor_parallel_group(unit):
    return _ask(unit, "get_tensor_model_parallel_group", "get_model_parallel_group")
