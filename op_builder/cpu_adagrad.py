"""CPUAdagradBuilder: the host Adagrad kernel behind DeepSpeedCPUAdagrad (dense gradients)."""
from deepspeed.ops.op_builder.cpu_adam import CPUOptimizerBuilder


class CPUAdagradBuilder(CPUOptimizerBuilder):
    NAME = "cpu_adagrad"
    SOURCE = "cpu_adagrad.cpp"

    def absolute_name(self):
        return f"deepspeed.ops.adagrad.{self.NAME}_op"
