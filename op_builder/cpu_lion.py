"""CPULionBuilder: the host Lion kernel behind DeepSpeedCPULion."""
from deepspeed.ops.op_builder.cpu_adam import CPUOptimizerBuilder


class CPULionBuilder(CPUOptimizerBuilder):
    NAME = "cpu_lion"
    SOURCE = "cpu_lion.cpp"

    def absolute_name(self):
        return f"deepspeed.ops.lion.{self.NAME}_op"
