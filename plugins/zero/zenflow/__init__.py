"""ZenFlow: stall-free ZeRO-Offload (the `zero_optimization.zenflow` section).

A sub-package of the zero plugin because it *is* a ZeRO optimizer (a subclass of
``DeepSpeedZeroOptimizer``) over ZeRO's own partitions and reducer; the plugin builds it instead
of the plain one when the section is present. See ``optimizer`` for the step.
"""
from deepspeed.utils.lazy_exports import lazy_exports
from deepspeed.zero.zenflow.config import ZenFlowConfig

__all__ = ["ZenFlowConfig", "ZenFlowZeroOptimizer"]

# the optimizer loads on first use: it imports the accelerator and comm
__getattr__, __dir__ = lazy_exports(
    __name__, {"ZenFlowZeroOptimizer": "deepspeed.zero.zenflow.optimizer"})
