"""``deepspeed.checkpoint.deepspeed_checkpoint``: upstream's module path of
``DeepSpeedCheckpoint`` (the real module is ``deepspeed.zero.deepspeed_checkpoint``)."""
from deepspeed.zero.deepspeed_checkpoint import DeepSpeedCheckpoint

__all__ = ["DeepSpeedCheckpoint"]
