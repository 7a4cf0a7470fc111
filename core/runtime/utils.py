"""`deepspeed.runtime.utils`, the path user scripts (Accelerate's ALST example) import from.

``CheckOverflow`` is ``deepspeed.precision.overflow``'s. ``partition_uniform`` /
``partition_balanced`` are the pipeline plugin's (it exports them here
through the entry-point group ``deepspeed.exports.runtime.utils``: the core imports no plugin).
"""
from deepspeed.precision.overflow import CheckOverflow
from deepspeed.utils.lazy_exports import plugin_exports
from deepspeed.utils.nested import move_to_device
from deepspeed.utils.reports import see_memory_usage

__all__ = ["move_to_device", "see_memory_usage", "CheckOverflow", "partition_uniform",
           "partition_balanced"]

__getattr__, __dir__ = plugin_exports(__name__)
