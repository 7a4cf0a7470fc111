"""`deepspeed.runtime.utils`, the path user scripts (Accelerate's ALST example) import from."""
from deepspeed.utils.nested import move_to_device
from deepspeed.utils.partitioning import partition_balanced, partition_uniform
from deepspeed.utils.reports import see_memory_usage

__all__ = ["move_to_device", "see_memory_usage", "partition_uniform", "partition_balanced"]
