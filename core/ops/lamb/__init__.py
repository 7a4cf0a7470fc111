"""LAMB for DeepSpeed (`deepspeed.ops.lamb`)."""
from deepspeed.ops.lamb.fused_lamb import FusedLamb

__all__ = ["FusedLamb"]
