"""DeepSpeedCPUAdam: Adam/AdamW for ZeRO-Offload, stepping fp32 master weights on the host.

Moments are fp32 whatever the param dtype (``fp32_optimizer_states=True``), steps are counted per
tensor, and ``step(fp16_param_groups=...)`` writes the updated values into device copies in the
same call. The math is ``deepspeed.ops.adam.functional.adam_update_``.
"""
import torch

from deepspeed.ops.adam.functional import adam_step_
from deepspeed.ops.adam.multi_tensor_apply import (CPUOptimizerMixin, MultiTensorOptimizer,
                                                   check_hyperparameters)


class DeepSpeedCPUAdam(CPUOptimizerMixin, MultiTensorOptimizer):
    """``adamw_mode=True`` decays weights decoupled (AdamW), False adds ``wd*p`` to the gradient
    (Adam with L2). ``amsgrad`` is accepted and ignored, as upstream."""

    state_keys = ("exp_avg", "exp_avg_sq")

    def __init__(self, model_params, lr=1e-3, bias_correction=True, betas=(0.9, 0.999), eps=1e-8,
                 weight_decay=0, amsgrad=False, adamw_mode=True, fp32_optimizer_states=True):
        check_hyperparameters("DeepSpeedCPUAdam", lr=lr, eps=eps, betas=betas,
                              weight_decay=weight_decay)
        defaults = dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay,
                        bias_correction=bias_correction, amsgrad=amsgrad)
        super().__init__(model_params, defaults)
        self.adamw_mode = bool(adamw_mode)
        self.fp32_optimizer_states = bool(fp32_optimizer_states)

    @torch.no_grad()
    def step(self, closure=None, fp16_param_groups=None):
        loss = self.run_closure(closure)
        adam_step_(self, self.adamw_mode)
        self.copy_to_fp16_groups(fp16_param_groups)
        return loss
