"""CPUAdamBuilder: the host Adam/AdamW kernel behind DeepSpeedCPUAdam (ZeRO-Offload).

The CPU optimizer kernels take raw data pointers checked on the Python side
(``deepspeed.ops.adam.native``), so their modules are written against the CPython C API alone,
without ATen or pybind11: a JIT build compiles for about a second, not 11-40 s.
"""
from deepspeed.ops.op_builder.builder import OpBuilder


class CPUOptimizerBuilder(OpBuilder):
    """Shared flags of the CPU optimizer kernels (csrc/cpu/). ``-fno-math-errno`` lets g++
    vectorise sqrtf (without it every lane keeps a scalar errno path); no -ffast-math, which
    would reorder the documented update and break exactness against the PyTorch path."""

    SOURCE = ""

    def sources(self):
        return [f"cpu/{self.SOURCE}"]

    def include_paths(self):
        return ["cpu"]

    def cxx_args(self):
        return super().cxx_args() + ["-fno-math-errno"]


class CPUAdamBuilder(CPUOptimizerBuilder):
    NAME = "cpu_adam"
    SOURCE = "cpu_adam.cpp"

    def absolute_name(self):
        return f"deepspeed.ops.adam.{self.NAME}_op"
