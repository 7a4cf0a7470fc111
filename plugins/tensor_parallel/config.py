"""The ``tensor_parallel`` training config section (AutoTP training).

    "tensor_parallel": {"autotp_size": 2}

``autotp_size`` is the number of ranks one model is split over (0 or 1: no tensor
parallelism); it must divide the world size, and the other factor is the data-parallel size.
Transformers reads the same key to call ``deepspeed.tp_model_init`` and to size its data
loaders. The other keys are upstream's: ``injection_policy_tuple`` names the Linear layers
that write into the residual stream when AutoTP cannot find them (``("o_proj", "down_proj")``);
``tp_overlap_comm`` overlaps each column-parallel Linear's input-gradient all-reduce with its
weight gradient in backward; each shard moves to the accelerator as it is cut unless
``keep_module_on_host`` leaves the split model where it sits; ``dtype`` and ``tp_grain_size``
are accepted without effect (warned once); kernel injection is refused.
"""
from typing import Any, Optional, Tuple

from pydantic import Field, field_validator

from deepspeed.config.model import DeepSpeedConfigModel

SECTION = "tensor_parallel"


class TPConfig(DeepSpeedConfigModel):
    """``tensor_parallel.tensor_parallel``: upstream's nested inference-style block."""

    tp_size: int = Field(1, ge=1)
    tp_grain_size: int = Field(1, ge=1)
    mpu: Any = None
    tp_group: Any = None


class TensorParallelTrainingConfig(DeepSpeedConfigModel):
    """``tensor_parallel``: AutoTP training."""

    # what each key does here (see deepspeed.config.model)
    tested_by = {
        "autotp_size": "tests/plugins/tensor_parallel/test_tp_checkpoint_and_errors.py::"
                       "test_bad_tensor_parallel_input_is_a_clear_error",
        "injection_policy_tuple": "tests/plugins/tensor_parallel/test_tp_keys.py::"
                                  "test_injection_policy_tuple_names_the_row_parallel_layers",
        "tp_overlap_comm": "tests/plugins/tensor_parallel/test_tp_keys.py::"
                           "test_tp_overlap_comm_reduces_input_grads_asynchronously",
        "keep_module_on_host": "tests/plugins/tensor_parallel/test_tp_keys.py::"
                               "test_keep_module_on_host_keeps_the_shards_on_the_host",
    }
    refused = {
        "replace_with_kernel_inject": "AutoTP training uses no fused inference kernels; leave it "
                                      "false (init_inference has kernel injection)",
        **dict.fromkeys(
            ("tensor_parallel.tp_size", "tensor_parallel.mpu", "tensor_parallel.tp_group"),
            "the nested block holds init_inference's settings; for training set "
            "tensor_parallel.autotp_size"),
    }

    autotp_size: int = Field(0, ge=0)
    tp_overlap_comm: bool = Field(False, description="backward: all-reduce each column-parallel "
                                  "Linear's input gradient asynchronously, overlapped with its "
                                  "weight gradient")
    keep_module_on_host: bool = Field(False, description="leave the split Linears where the "
                                      "model sits instead of moving each shard to the device "
                                      "as it is cut")
    replace_with_kernel_inject: bool = False
    injection_policy_tuple: Optional[Tuple[str, ...]] = None
    dtype: Any = None
    tensor_parallel: TPConfig = Field(default_factory=TPConfig)

    without_effect = {
        "tensor_parallel.tp_grain_size": "every split is an even division by autotp_size",
        "dtype": "the training dtype comes from the fp16 / bf16 sections (and tp_model_init's "
                 "dtype argument)",
    }

    @field_validator("replace_with_kernel_inject")
    @classmethod
    def _no_kernels(cls, value):
        if value:
            raise ValueError("tensor_parallel.replace_with_kernel_inject=true asks for fused "
                             "inference kernels, which AutoTP training does not use; remove it "
                             "or set it to false")
        return value

    @field_validator("tensor_parallel")
    @classmethod
    def _no_nested_size(cls, value):
        if value.tp_size != 1 or value.mpu is not None or value.tp_group is not None:
            raise ValueError("tensor_parallel.tensor_parallel.{tp_size, mpu, tp_group} are "
                             "inference settings; for training set tensor_parallel.autotp_size")
        return value

    @property
    def size(self):
        """The tensor-parallel size this section asks for (0 counts as 1)."""
        return max(self.autotp_size, 1)
