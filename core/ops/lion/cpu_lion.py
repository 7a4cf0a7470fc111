"""DeepSpeedCPULion: Lion for ZeRO-Offload, stepping fp32 master weights on the host with fp32
momentum (``fp32_optimizer_states``) and an optional copy into device params in the same call."""
import torch

from deepspeed.ops.adam.multi_tensor_apply import (CPUOptimizerMixin, MultiTensorOptimizer,
                                                   check_hyperparameters)
from deepspeed.ops.lion.functional import lion_step_


class DeepSpeedCPULion(CPUOptimizerMixin, MultiTensorOptimizer):
    state_keys = ("exp_avg",)

    def __init__(self, model_params, lr=1e-4, betas=(0.9, 0.99), weight_decay=0,
                 fp32_optimizer_states=True):
        check_hyperparameters("DeepSpeedCPULion", lr=lr, betas=betas, weight_decay=weight_decay)
        super().__init__(model_params, dict(lr=lr, betas=tuple(betas), weight_decay=weight_decay))
        self.fp32_optimizer_states = bool(fp32_optimizer_states)

    @torch.no_grad()
    def step(self, closure=None, fp16_param_groups=None):
        loss = self.run_closure(closure)
        lion_step_(self)
        self.copy_to_fp16_groups(fp16_param_groups)
        return loss
