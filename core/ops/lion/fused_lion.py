"""FusedLion: the multi-tensor Lion optimizer (one foreach launch per op per device/dtype)."""
import torch

from deepspeed.ops.adam.multi_tensor_apply import MultiTensorOptimizer, check_hyperparameters
from deepspeed.ops.lion.functional import lion_step_


class FusedLion(MultiTensorOptimizer):
    """``set_grad_none`` makes ``zero_grad()`` drop gradients instead of zeroing them."""

    state_keys = ("exp_avg",)

    def __init__(self, params, lr=1e-4, betas=(0.9, 0.99), weight_decay=0.0, set_grad_none=True):
        check_hyperparameters("FusedLion", lr=lr, betas=betas, weight_decay=weight_decay)
        super().__init__(params, dict(lr=lr, betas=tuple(betas), weight_decay=weight_decay))
        self.set_grad_none = set_grad_none

    def zero_grad(self, set_to_none=None):
        super().zero_grad(set_to_none=self.set_grad_none if set_to_none is None else set_to_none)

    @torch.no_grad()
    def step(self, closure=None):
        loss = self.run_closure(closure)
        lion_step_(self)
        return loss
