"""Builder of the CUDA multi-tensor Adam op used by ``deepspeed.ops.adam.FusedAdam`` on GPUs."""
from .builder import CUDAOpBuilder


class FusedAdamBuilder(CUDAOpBuilder):
    """The kernel (.cu) needs only the CUDA toolkit; the frontend (.cpp) binds it to torch."""

    NAME = "fused_adam"

    def absolute_name(self):
        return f"deepspeed.ops.adam.{self.NAME}_op"

    def sources(self):
        return ["adam/fused_adam_frontend.cpp", "adam/multi_tensor_adam.cu"]

    def include_paths(self):
        return ["adam"]

    def nvcc_args(self):
        # Without --use_fast_math: the kernel must track torch's Adam to fp32 rounding.
        return [arg for arg in super().nvcc_args() if arg != "--use_fast_math"]
