"""`offload_param` / `offload_optimizer`: where ZeRO keeps parameters and optimizer state.

Both sub-sections share the device choice and the NVMe path rule (an NVMe device is useless
without a directory to swap into, so that is rejected here rather than at the first swap).
Which ZeRO stages may use which offload is a cross-field rule of `DeepSpeedZeroConfig`.
"""
from enum import Enum
from typing import Any, Optional

from pydantic import Field, field_validator, model_validator

from deepspeed.config.model import DeepSpeedConfigModel

__all__ = ["OffloadDeviceEnum", "DeepSpeedZeroOffloadParamConfig", "DeepSpeedZeroOffloadOptimizerConfig"]


class OffloadDeviceEnum(str, Enum):
    """Where offloaded tensors live. A `str` enum so `device == "cpu"` reads naturally."""

    none = "none"
    cpu = "cpu"
    nvme = "nvme"

    def __str__(self) -> str:
        return self.value


def _normalise_device(value: Any) -> Any:
    # JSON configs in the wild write "CPU" / "NVMe"; the meaning is unambiguous.
    if isinstance(value, str):
        return value.strip().lower()
    return value


class _OffloadBase(DeepSpeedConfigModel):
    device: OffloadDeviceEnum = OffloadDeviceEnum.none
    nvme_path: Optional[str] = None
    pin_memory: bool = False

    @field_validator("device", mode="before")
    @classmethod
    def _device_spelling(cls, value: Any) -> Any:
        return _normalise_device(value)

    @field_validator("nvme_path", mode="before")
    @classmethod
    def _path_as_string(cls, value: Any) -> Any:
        # A pathlib.Path from Python callers is kept as the user's string, not resolved.
        if value is not None and not isinstance(value, str) and hasattr(value, "__fspath__"):
            return str(value)
        return value

    @model_validator(mode="after")
    def _nvme_needs_path(self):
        if self.device == OffloadDeviceEnum.nvme and not self.nvme_path:
            raise ValueError('device "nvme" needs "nvme_path" (the directory swap files are written to)')
        return self

    @property
    def enabled(self) -> bool:
        """Whether this offload actually moves anything (device is not "none")."""
        return self.device != OffloadDeviceEnum.none


class DeepSpeedZeroOffloadParamConfig(_OffloadBase):
    """`zero_optimization.offload_param` (ZeRO stage 3 only): partitioned params on CPU or NVMe."""

    # what each key does here (see deepspeed.config.model)
    tested_by = {
        "device": "tests/plugins/zero/test_zero_stage3.py::test_zero_inference_without_an_"
                  "optimizer",
        "nvme_path": "tests/plugins/zero/test_zero_stage3.py::test_zero_init_straight_to_nvme",
        "pin_memory": "tests/plugins/zero/test_zero_gpu.py::test_zero_on_one_gpu_matches_adamw",
        **dict.fromkeys(("buffer_count", "buffer_size"),
                        "tests/plugins/zero/test_zero3_key_effects.py::"
                        "test_offload_param_buffers_come_from_the_config"),
        "max_in_cpu": "tests/plugins/zero/test_zero_stage3.py::test_nvme_param_and_optimizer_"
                      "offload",
    }

    buffer_count: int = Field(5, ge=0, description="buffers in the NVMe parameter buffer pool")
    buffer_size: int = Field(100_000_000, ge=0, description="elements per NVMe parameter buffer")
    max_in_cpu: int = Field(1_000_000_000, ge=0,
                            description="parameter elements kept in CPU memory when NVMe offload is on")


class DeepSpeedZeroOffloadOptimizerConfig(_OffloadBase):
    """`zero_optimization.offload_optimizer` (stages 1-3): optimizer state and step on CPU/NVMe."""

    # what each key does here (see deepspeed.config.model)
    tested_by = {
        "fast_init": "tests/plugins/zero/test_zero_nvme_pipeline.py::"
                     "test_fast_init_queues_the_initial_writes_together",
        "device": "tests/plugins/zero/test_zero_hooks.py::test_zero_answers_optimizer_device_and_"
                  "sharding",
        "nvme_path": "tests/plugins/zero/test_zero_debug_access.py::"
                     "test_nvme_sub_groups_match_reference",
        "pin_memory": "tests/plugins/zero/test_zero_training.py::test_cpu_offload_matches_"
                      "reference",
        "buffer_count": "tests/plugins/zero/test_zero3_key_effects.py::"
                        "test_the_aio_section_configures_the_nvme_swap_handle",
        "pipeline_read": "tests/plugins/zero/test_zero_nvme_pipeline.py::"
                         "test_pipeline_read_and_write_overlap_io_with_the_step",
        "pipeline_write": "tests/plugins/zero/test_zero_nvme_pipeline.py::"
                          "test_pipeline_read_and_write_overlap_io_with_the_step",
        "ratio": "tests/plugins/zero/test_zero_partial_offload.py::"
                 "test_half_the_optimizer_state_is_offloaded_and_training_equals_full_offload",
    }

    buffer_count: int = Field(4, ge=0, description="NVMe swap buffers; at least the optimizer states "
                                                   "per parameter (Adam: param, grad, momentum, variance)")
    pipeline_read: bool = Field(False, description="NVMe: read the next sub-group of the "
                                "optimizer step while this one steps")
    pipeline_write: bool = Field(False, description="NVMe: write a stepped sub-group while the "
                                 "next one steps")
    fast_init: bool = Field(False, description="NVMe: queue the first writes of every "
                            "sub-group together at initialisation (buffer_count in flight) "
                            "instead of waiting for each")
    ratio: float = Field(1.0, ge=0.0, le=1.0, description="fraction of each rank's optimizer state "
                         "(fp32 masters and moments) on the offload device, stepped there; the "
                         "rest stays on the accelerator and is stepped there (< 1 is partial "
                         "offload, stage 3 only; deepspeed.zero.offload.partial)")

    @property
    def pipeline(self) -> bool:
        """Tile-pipelined NVMe swapping: on when either direction overlaps with compute."""
        return self.pipeline_read or self.pipeline_write
