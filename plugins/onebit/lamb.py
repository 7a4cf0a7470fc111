"""1-bit LAMB (arXiv 2104.06069): LAMB whose momentum crosses the wire in 1 bit after warm-up.

- Steps ``1 .. freeze_step`` (warm-up): DeepSpeed's LAMB (``deepspeed.ops.lamb``'s math: trust
  ratio ``|p| / |u|`` clamped to ``[min_coeff, max_coeff]``) on gradients the engine all-reduces
  in full precision. Each computed coefficient feeds an EMA,
  ``lamb_coeff_freeze = coeff_beta * lamb_coeff_freeze + (1 - coeff_beta) * coeff`` (from 0).
  At ``freeze_step`` the variance is copied into ``exp_avg_sq_fresh``.
- Later steps (compression): the engine skips its all-reduce; each rank folds its local gradient
  into the momentum, the ranks agree on it with the 1-bit all-reduce (per-tensor scales, so
  upstream's ``scaling_coeff`` rebalancing of one flat buffer is not needed), and masked entries
  are zeroed. ``v`` is frozen; a fresh variance follows the gradient reconstructed from the
  momenta, ``g = (m_t - beta1 m_{t-1}) / (1 - beta1)``. Per tensor,
  ``factor = max(denom_frozen / denom_fresh)``, blended toward 1 by the share of the update
  that weight decay makes, clamped to ``[factor_min, factor_max]`` and then to
  ``last_factor * (1 ± factor_threshold)``; the step uses ``lamb_coeff_freeze * factor``.
"""
import math

import torch

from deepspeed.onebit.base import MASK_KEY, OneBitOptimizer, check_positive_int
from deepspeed.ops.lamb.functional import lamb_update_


def _denom(exp_avg_sq, eps, eps_inside_sqrt):
    if eps_inside_sqrt:
        return (exp_avg_sq + eps).sqrt_()
    return exp_avg_sq.sqrt().add_(eps)


class OnebitLamb(OneBitOptimizer):
    def __init__(self, params, deepspeed=None, lr=1e-3, freeze_step=100000, bias_correction=True,
                 betas=(0.9, 0.999), eps=1e-8, eps_inside_sqrt=False, weight_decay=0.0,
                 max_grad_norm=0.0, max_coeff=10.0, min_coeff=0.01, amsgrad=False,
                 cuda_aware=False, comm_backend_name="nccl", coeff_beta=0.9, factor_max=4.0,
                 factor_min=0.5, factor_threshold=0.1):
        name = type(self).__name__
        check_positive_int(name, freeze_step=freeze_step)
        if not 0 <= min_coeff <= max_coeff:
            raise ValueError(f"{name}: need 0 <= min_coeff <= max_coeff, got "
                             f"min_coeff={min_coeff}, max_coeff={max_coeff}")
        if not 0 < factor_min <= 1 <= factor_max:
            raise ValueError(f"{name}: need 0 < factor_min <= 1 <= factor_max, got "
                             f"factor_min={factor_min}, factor_max={factor_max}")
        if not 0 <= coeff_beta < 1 or not 0 <= factor_threshold < 1:
            raise ValueError(f"{name}: coeff_beta and factor_threshold must lie in [0, 1), got "
                             f"coeff_beta={coeff_beta}, factor_threshold={factor_threshold}")
        self.freeze_step = freeze_step
        self.eps_inside_sqrt = bool(eps_inside_sqrt)
        self.coeff_beta = coeff_beta
        self.factor_max, self.factor_min = factor_max, factor_min
        self.factor_threshold = factor_threshold
        self.lamb_coeffs = []
        defaults = dict(lr=lr, bias_correction=bias_correction, betas=tuple(betas), eps=eps,
                        weight_decay=weight_decay, max_coeff=max_coeff, min_coeff=min_coeff)
        super().__init__(params, defaults, deepspeed=deepspeed, amsgrad=amsgrad,
                         max_grad_norm=max_grad_norm, cuda_aware=cuda_aware,
                         comm_backend_name=comm_backend_name)

    def full_precision_reduction(self, step):
        return step <= self.freeze_step

    def get_lamb_coeffs(self):
        """The coefficient each parameter was stepped with in the last step, in group order."""
        return list(self.lamb_coeffs)

    def _state(self, param):
        return self._moment_state(param, lamb_coeff_freeze=0.0, last_factor=1.0)

    @torch.no_grad()
    def step(self, closure=None):
        loss, step = self._begin_step(closure)
        if step <= self.freeze_step:
            self.lamb_coeffs = self._warmup(step)
        else:
            self.lamb_coeffs = self._compressed(step)
        self._set_reduction()
        return loss

    def _warmup(self, step):
        coeffs = []
        for group in self.param_groups:
            params = list(group["params"])
            states = [self._state(p) for p in params]
            beta1, beta2 = group["betas"]
            computed = lamb_update_(
                params, [self.grad_of(p) for p in params], [s["exp_avg"] for s in states],
                [s["exp_avg_sq"] for s in states], step=step, lr=group["lr"], beta1=beta1,
                beta2=beta2, eps=group["eps"], eps_inside_sqrt=self.eps_inside_sqrt,
                weight_decay=group["weight_decay"], bias_correction=group["bias_correction"],
                max_coeff=group["max_coeff"], min_coeff=group["min_coeff"])
            for param, state, coeff in zip(params, states, computed.tolist()):
                if coeff != 1.0:
                    state["lamb_coeff_freeze"] = (self.coeff_beta * state["lamb_coeff_freeze"]
                                                  + (1.0 - self.coeff_beta) * coeff)
                if step == self.freeze_step:
                    state["exp_avg_sq_fresh"] = state["exp_avg_sq"].clone()
                coeffs.append(coeff)
        return coeffs

    def _factor(self, state, group, update, param):
        fresh = _denom(state["exp_avg_sq_fresh"], group["eps"], self.eps_inside_sqrt)
        frozen = _denom(state["exp_avg_sq"], group["eps"], self.eps_inside_sqrt)
        ratio = frozen / fresh
        mask = group.get(MASK_KEY)
        if mask is not None:  # masked entries never move: their fresh variance only decays
            ratio = ratio * mask.to(ratio.dtype)
        factor = float(ratio.max())
        if group["weight_decay"]:
            with_decay = float((update + group["weight_decay"] * param).norm())
            ratio = float(update.norm()) / with_decay if with_decay > 0 else 1.0
            factor = factor * ratio + (1.0 - ratio)
        factor = min(max(factor, self.factor_min), self.factor_max)
        last = state["last_factor"]
        factor = min(max(factor, last * (1.0 - self.factor_threshold)),
                     last * (1.0 + self.factor_threshold))
        state["last_factor"] = factor
        return factor

    def _compressed(self, step):
        params = self.params_in_order()
        states = [self._state(p) for p in params]
        groups = [g for g in self.param_groups for _ in g["params"]]
        previous = [s["exp_avg"].clone() for s in states]
        for param, state, group in zip(params, states, groups):
            state["exp_avg"].lerp_(self.grad_of(param), 1.0 - group["betas"][0])
        averaged = self.compressed_average([s["exp_avg"] for s in states])
        coeffs = []
        for param, state, group, value, before in zip(params, states, groups, averaged, previous):
            beta1, beta2 = group["betas"]
            exp_avg = state["exp_avg"].copy_(value)
            self.apply_mask(group, exp_avg, param)
            if "exp_avg_sq_fresh" not in state:  # a param first seen after the freeze
                state["exp_avg_sq_fresh"] = state["exp_avg_sq"].clone()
            grad = (exp_avg - beta1 * before) / (1.0 - beta1)
            state["exp_avg_sq_fresh"].mul_(beta2).addcmul_(grad, grad, value=1.0 - beta2)
            update = exp_avg / _denom(state["exp_avg_sq"], group["eps"], self.eps_inside_sqrt)
            factor = self._factor(state, group, update, param)
            if group["weight_decay"]:
                update.add_(param, alpha=group["weight_decay"])
            coeff = state["lamb_coeff_freeze"] * factor
            step_size = group["lr"]
            if group["bias_correction"]:
                step_size *= (math.sqrt(1.0 - beta2 ** self.freeze_step)
                              / (1.0 - beta1 ** step))
            param.add_(update, alpha=-step_size * coeff)
            coeffs.append(coeff)
        return coeffs


OneBitLamb = OnebitLamb
