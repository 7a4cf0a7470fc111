"""DeepSpeedCPUAdam: Adam/AdamW for ZeRO-Offload, stepping fp32 master weights on the host.

Moments are fp32 whatever the param dtype (``fp32_optimizer_states=True``), steps are counted per
tensor, and ``step(fp16_param_groups=...)`` writes the updated values into device copies in the
same call. The math is ``deepspeed.ops.adam.functional.adam_update_``; fp32 contiguous buckets
go through the native kernel (csrc/cpu/cpu_adam.cpp) when it builds, which also writes bf16/fp16
host copies in the same pass (see ``deepspeed.ops.adam.native``).
"""
import torch

from deepspeed.ops.adam.functional import adam_step_, adam_update_
from deepspeed.ops.adam.multi_tensor_apply import (CPUOptimizerMixin, MultiTensorOptimizer,
                                                   check_hyperparameters)
from deepspeed.ops.adam.native import HalfTargets, load_kernel, native_ready, run_native
from deepspeed.ops.op_builder.cpu_adam import CPUAdamBuilder


class DeepSpeedCPUAdam(CPUOptimizerMixin, MultiTensorOptimizer):
    """``adamw_mode=True`` decays weights decoupled (AdamW), False adds ``wd*p`` to the gradient
    (Adam with L2). ``amsgrad`` is accepted and ignored, as upstream. ``use_native``: None uses
    the native kernel when it builds, False forces the PyTorch path, True requires the kernel."""

    state_keys = ("exp_avg", "exp_avg_sq")

    def __init__(self, model_params, lr=1e-3, bias_correction=True, betas=(0.9, 0.999), eps=1e-8,
                 weight_decay=0, amsgrad=False, adamw_mode=True, fp32_optimizer_states=True,
                 use_native=None):
        check_hyperparameters("DeepSpeedCPUAdam", lr=lr, eps=eps, betas=betas,
                              weight_decay=weight_decay)
        defaults = dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay,
                        bias_correction=bias_correction, amsgrad=amsgrad)
        super().__init__(model_params, defaults)
        self.adamw_mode = bool(adamw_mode)
        self.fp32_optimizer_states = bool(fp32_optimizer_states)
        self._native = load_kernel(CPUAdamBuilder, "DeepSpeedCPUAdam", use_native)

    @property
    def native(self):
        """The loaded kernel module, None on the PyTorch path (also after unpickling, since
        torch's Optimizer.__getstate__ keeps only defaults, state and param groups)."""
        return getattr(self, "_native", None)

    @torch.no_grad()
    def step(self, closure=None, fp16_param_groups=None):
        loss = self.run_closure(closure)
        if self.native is None:
            adam_step_(self, self.adamw_mode)
            self.copy_to_fp16_groups(fp16_param_groups)
            return loss
        targets = HalfTargets(self, fp16_param_groups)
        for group in self.param_groups:
            for bucket in self.buckets(group):
                self._update_bucket(group, bucket, targets)
        targets.finish()
        return loss

    def _update_bucket(self, group, bucket, targets):
        beta1, beta2 = group["betas"]
        hyper = dict(lr=group["lr"], beta1=beta1, beta2=beta2, eps=group["eps"],
                     weight_decay=group["weight_decay"], bias_correction=group["bias_correction"],
                     adamw_mode=self.adamw_mode)
        if not native_ready(bucket):
            self.apply_fp32(bucket, lambda b: adam_update_(
                b.params, b.grads, b.states["exp_avg"], b.states["exp_avg_sq"], step=b.step,
                **hyper))
            return
        run_native(self.native.adam_update, bucket, ("exp_avg", "exp_avg_sq"), targets,
                   step=bucket.step, **hyper)
