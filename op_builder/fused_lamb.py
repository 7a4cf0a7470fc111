"""Builder of the CUDA fused LAMB op used by ``deepspeed.ops.lamb.FusedLamb`` on GPUs."""
from .builder import CUDAOpBuilder


class FusedLambBuilder(CUDAOpBuilder):
    """Shares the multi-tensor-apply header and dtype helpers of the Adam op (csrc/adam)."""

    NAME = "fused_lamb"

    def absolute_name(self):
        return f"deepspeed.ops.lamb.{self.NAME}_op"

    def sources(self):
        return ["lamb/fused_lamb_cuda.cpp", "lamb/fused_lamb_cuda_kernel.cu"]

    def include_paths(self):
        return ["adam", "lamb"]

    def nvcc_args(self):
        # Without --use_fast_math: the trust ratio must match the PyTorch path's to fp32 rounding.
        return [arg for arg in super().nvcc_args() if arg != "--use_fast_math"]
