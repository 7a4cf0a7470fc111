"""1-bit Adam (arXiv 2102.02888): Adam whose momentum, not gradient, crosses the wire in 1 bit.

- Steps ``1 .. freeze_step`` (warm-up): plain Adam on gradients the engine all-reduces in full
  precision.
- Later steps (compression): the variance ``exp_avg_sq`` is frozen; the engine skips the gradient
  all-reduce; each rank folds its *local* gradient into the momentum and the ranks agree on the
  momentum through the error-compensated 1-bit all-reduce (``deepspeed.onebit.compressed``),
  after which ``exp_avg_mask`` zeroes masked entries and the Adam update uses the frozen variance.
  The momentum, the variance and so the parameters stay identical on every rank.

Differences from upstream, on purpose: no "dry run" first step (the transport needs no warm-up
buffers), and ``bias_correction`` is honoured (see ``deepspeed.onebit.adam_math``).
"""
import torch

from deepspeed.onebit.adam_math import adam_apply_, adam_denominator
from deepspeed.onebit.base import OneBitOptimizer, check_positive_int


class OnebitAdam(OneBitOptimizer):
    def __init__(self, params, deepspeed=None, lr=1e-3, freeze_step=100000, bias_correction=True,
                 betas=(0.9, 0.999), eps=1e-8, eps_inside_sqrt=False, weight_decay=0.0,
                 max_grad_norm=0.0, amsgrad=False, cuda_aware=False, comm_backend_name="nccl"):
        check_positive_int(type(self).__name__, freeze_step=freeze_step)
        self.freeze_step = freeze_step
        self.eps_inside_sqrt = bool(eps_inside_sqrt)
        defaults = dict(lr=lr, bias_correction=bias_correction, betas=tuple(betas), eps=eps,
                        weight_decay=weight_decay)
        super().__init__(params, defaults, deepspeed=deepspeed, amsgrad=amsgrad,
                         max_grad_norm=max_grad_norm, cuda_aware=cuda_aware,
                         comm_backend_name=comm_backend_name)

    def full_precision_reduction(self, step):
        return step <= self.freeze_step

    @property
    def compressing(self):
        """True once the warm-up is over."""
        return self.step_count > self.freeze_step

    def _state(self, param):
        return self._moment_state(param, var_updates=0)

    @torch.no_grad()
    def step(self, closure=None):
        loss, step = self._begin_step(closure)
        params = self.params_in_order()
        states = [self._state(p) for p in params]
        groups = [g for g in self.param_groups for _ in g["params"]]
        warmup = step <= self.freeze_step
        for param, state, group in zip(params, states, groups):
            beta1, beta2 = group["betas"]
            grad = self.grad_of(param)
            state["exp_avg"].lerp_(grad, 1.0 - beta1)
            if warmup:
                state["exp_avg_sq"].mul_(beta2).addcmul_(grad, grad, value=1.0 - beta2)
                state["var_updates"] += 1
        if not warmup:
            averaged = self.compressed_average([s["exp_avg"] for s in states])
            for param, state, group, value in zip(params, states, groups, averaged):
                state["exp_avg"].copy_(value)
                self.apply_mask(group, state["exp_avg"], param)
        for param, state, group in zip(params, states, groups):
            beta1, beta2 = group["betas"]
            denom = adam_denominator(state["exp_avg_sq"], state["var_updates"], beta2,
                                     group["eps"], self.eps_inside_sqrt, group["bias_correction"])
            adam_apply_(param, state["exp_avg"], denom, step, group["lr"], beta1,
                        group["weight_decay"], group["bias_correction"])
        self._set_reduction()
        return loss


OneBitAdam = OnebitAdam
