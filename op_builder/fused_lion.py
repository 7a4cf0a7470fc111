"""Builder of the CUDA multi-tensor Lion op used by ``deepspeed.ops.lion.FusedLion`` on GPUs."""
from .builder import CUDAOpBuilder


class FusedLionBuilder(CUDAOpBuilder):
    """The kernel (.cu) reuses the Adam kernel's multi-tensor launcher (csrc/adam)."""

    NAME = "fused_lion"

    def absolute_name(self):
        return f"deepspeed.ops.lion.{self.NAME}_op"

    def sources(self):
        return ["lion/fused_lion_frontend.cpp", "lion/multi_tensor_lion.cu"]

    def include_paths(self):
        return ["lion", "adam"]

    def nvcc_args(self):
        # Without --use_fast_math: the kernel must track the PyTorch path to fp32 rounding.
        return [arg for arg in super().nvcc_args() if arg != "--use_fast_math"]
