"""ZenFlow: stall-free ZeRO-Offload (the `zero_optimization.zenflow` section).

A sub-package of the zero plugin because it *is* a ZeRO optimizer (a subclass of
``DeepSpeedZeroOptimizer``) over ZeRO's own partitions and reducer; the plugin builds it instead
of the plain one when the section is present. See ``optimizer`` for the step.
"""
from deepspeed.zero.zenflow.config import ZenFlowConfig

__all__ = ["ZenFlowConfig", "ZenFlowZeroOptimizer"]


def __getattr__(name):
    if name == "ZenFlowZeroOptimizer":  # lazily: it imports the accelerator and comm
        from deepspeed.zero.zenflow.optimizer import ZenFlowZeroOptimizer
        return ZenFlowZeroOptimizer
    raise AttributeError(name)
