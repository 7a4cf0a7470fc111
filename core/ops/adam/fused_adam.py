"""FusedAdam: DeepSpeed's multi-tensor Adam/AdamW, a drop-in for ``torch.optim.AdamW`` (or
``torch.optim.Adam`` with ``adam_w_mode=False``).

The update of all params of a group that share a device and dtype runs as one foreach launch per
operation; fp16/bf16 params keep fp16/bf16 moments and are computed in fp32.
"""
import torch

from deepspeed.ops.adam.functional import adam_step_
from deepspeed.ops.adam.multi_tensor_apply import MultiTensorOptimizer, check_hyperparameters

_LEGACY_STEP_ARGS = ("grads", "output_params", "scale", "grad_norms", "grad_scaler")


class FusedAdam(MultiTensorOptimizer):
    """``amsgrad`` is not supported (RuntimeError, as upstream). ``set_grad_none`` makes
    ``zero_grad()`` drop gradients instead of zeroing them. The step count lives in
    ``group['step']`` so a caller that regroups params (ZeRO-3 sub-groups) can carry it over."""

    state_keys = ("exp_avg", "exp_avg_sq")

    def __init__(self, params, lr=1e-3, bias_correction=True, betas=(0.9, 0.999), eps=1e-8,
                 adam_w_mode=True, weight_decay=0., amsgrad=False, set_grad_none=True):
        if amsgrad:
            raise RuntimeError("FusedAdam does not support the AMSGrad variant.")
        check_hyperparameters("FusedAdam", lr=lr, eps=eps, betas=betas, weight_decay=weight_decay)
        defaults = dict(lr=lr, bias_correction=bias_correction, betas=tuple(betas), eps=eps,
                        weight_decay=weight_decay)
        super().__init__(params, defaults)
        self.adam_w_mode = bool(adam_w_mode)
        self.set_grad_none = set_grad_none

    def zero_grad(self, set_to_none=None):
        super().zero_grad(set_to_none=self.set_grad_none if set_to_none is None else set_to_none)

    @torch.no_grad()
    def step(self, closure=None, grads=None, output_params=None, scale=None, grad_norms=None,
             grad_scaler=None):
        """One Adam step over every param with a gradient. The extra arguments of the old
        apex-style API are refused rather than silently ignored."""
        if any(arg is not None for arg in (grads, output_params, scale, grad_norms, grad_scaler)):
            raise RuntimeError("FusedAdam has been updated. Simply initialize it identically to "
                               "torch.optim.Adam, and call step() with no arguments.")
        loss = self.run_closure(closure)
        adam_step_(self, self.adam_w_mode)
        return loss
