"""DeepSpeedCPULion: Lion for ZeRO-Offload, stepping fp32 master weights on the host with fp32
momentum (``fp32_optimizer_states``) and an optional copy into device params in the same call.
fp32 contiguous buckets go through the native kernel (csrc/cpu/cpu_lion.cpp) when it builds,
which writes bf16/fp16 host copies in the same pass (see ``deepspeed.ops.adam.native``)."""
import torch

from deepspeed.ops.adam.multi_tensor_apply import (CPUOptimizerMixin, MultiTensorOptimizer,
                                                   check_hyperparameters)
from deepspeed.ops.adam.native import HalfTargets, load_kernel, native_ready, run_native
from deepspeed.ops.lion.functional import lion_step_, lion_update_
from deepspeed.ops.op_builder.cpu_lion import CPULionBuilder


class DeepSpeedCPULion(CPUOptimizerMixin, MultiTensorOptimizer):
    """``use_native``: None uses the native kernel when it builds, False forces the PyTorch
    path, True requires the kernel."""

    state_keys = ("exp_avg",)

    def __init__(self, model_params, lr=1e-4, betas=(0.9, 0.99), weight_decay=0,
                 fp32_optimizer_states=True, use_native=None):
        check_hyperparameters("DeepSpeedCPULion", lr=lr, betas=betas, weight_decay=weight_decay)
        super().__init__(model_params, dict(lr=lr, betas=tuple(betas), weight_decay=weight_decay))
        self.fp32_optimizer_states = bool(fp32_optimizer_states)
        self._native = load_kernel(CPULionBuilder, "DeepSpeedCPULion", use_native)

    @property
    def native(self):
        """The loaded kernel module, None on the PyTorch path (and after unpickling)."""
        return getattr(self, "_native", None)

    @torch.no_grad()
    def step(self, closure=None, fp16_param_groups=None):
        loss = self.run_closure(closure)
        if self.native is None:
            lion_step_(self)
            self.copy_to_fp16_groups(fp16_param_groups)
            return loss
        targets = HalfTargets(self, fp16_param_groups)
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            hyper = dict(lr=group["lr"], beta1=beta1, beta2=beta2,
                         weight_decay=group["weight_decay"])
            for bucket in self.buckets(group):
                if not native_ready(bucket):
                    self.apply_fp32(bucket, lambda b: lion_update_(
                        b.params, b.grads, b.states["exp_avg"], **hyper))
                    continue
                run_native(self.native.lion_update, bucket, ("exp_avg",), targets, **hyper)
        targets.finish()
        return loss
