"""`aio`: tuning of the asynchronous NVMe I/O handle used by ZeRO-Infinity swapping.

Upstream reads this section at the top level of the config; the DeepSpeed/HF docs' NVMe example
nests it inside `zero_optimization` and spells `intra_op_parallelism` as `thread_count`. Both
locations and both spellings are accepted (the ZeRO config has an `aio` field of this type).
"""
from typing import Annotated, Any, Dict

from pydantic import Field

from deepspeed.config.model import DeepSpeedConfigModel, deprecated_alias

__all__ = ["AioConfig"]


class AioConfig(DeepSpeedConfigModel):
    """Parameters of `deepspeed.ops.aio.aio_handle` for the NVMe swapper."""

    # what each key does here (see deepspeed.config.model)
    tested_by = dict.fromkeys(
        ("block_size", "queue_depth", "intra_op_parallelism", "single_submit", "overlap_events"),
        "tests/plugins/zero/test_zero3_key_effects.py::"
        "test_the_aio_section_configures_the_nvme_swap_handle")
    without_effect = {
        "use_gds": "GPUDirect Storage needs NVIDIA cuFile, which this build does not use: NVMe "
                   "swaps go through host buffers with the async_io op (libaio, or its thread "
                   "fallback), which is what runs",
    }

    block_size: int = Field(1_048_576, gt=0, description="bytes per I/O request")
    queue_depth: int = Field(8, gt=0, description="I/O requests in flight")
    intra_op_parallelism: Annotated[int, deprecated_alias("thread_count")] = Field(
        1, gt=0, description="threads each read/write is split across")
    single_submit: bool = False
    overlap_events: bool = True
    use_gds: bool = False

    def handle_kwargs(self) -> Dict[str, Any]:
        """Keyword arguments for `deepspeed.ops.aio.aio_handle(**kwargs)`.

        `use_gds` is not a handle argument: it selects a different (GPUDirect) handle class,
        so the caller reads it separately.
        """
        return {
            "block_size": self.block_size,
            "queue_depth": self.queue_depth,
            "single_submit": self.single_submit,
            "overlap_events": self.overlap_events,
            "intra_op_parallelism": self.intra_op_parallelism,
        }
