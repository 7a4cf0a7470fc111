"""0/1 Adam (arXiv 2202.06009): adaptive variance freezing plus local steps.

Up to ``var_freeze_step``:

- at the variance-update steps (``deepspeed.onebit.schedules``) the engine all-reduces gradients
  in full precision and the step is plain Adam (``m`` and ``v`` both move);
- at every other step the engine skips its all-reduce; the ranks average their local gradients
  with the 1-bit error-compensated all-reduce, and only ``m`` moves (``v`` stays).

After ``var_freeze_step`` (``v`` frozen for good; the error buffers are reset once):

- every step is local: each rank moves ``m`` with its own gradient and applies the Adam update
  to its own copy of the parameters, with no communication at all;
- at the synchronisation steps the ranks average what they moved since the last
  synchronisation (``sync_base - p``, the lr-scaled updates) with the 1-bit all-reduce, set
  ``p = sync_base - average`` (identical on every rank) and rebuild ``m`` from that average:
  ``m = (average / sum(lr) - wd * sync_base) * denom * (1 - beta1^t)`` (the weight-decay term is
  taken at ``sync_base``, an approximation over one interval).

A checkpoint load resets the error buffers and the local-step buffers (``sync_base`` restarts
at the loaded parameters), as the tutorial says.
"""
import torch

from deepspeed.onebit.adam_math import adam_apply_, adam_denominator
from deepspeed.onebit.base import OneBitOptimizer, check_positive_int
from deepspeed.onebit.schedules import SyncSchedule, variance_steps


class ZeroOneAdam(OneBitOptimizer):
    def __init__(self, params, deepspeed=None, lr=1e-3, bias_correction=True, betas=(0.9, 0.999),
                 eps=1e-8, eps_inside_sqrt=False, weight_decay=0.0, max_grad_norm=0.0,
                 var_freeze_step=100000, var_update_scaler=16, local_step_scaler=32678,
                 local_step_clipper=16, amsgrad=False, cuda_aware=False,
                 comm_backend_name="nccl"):
        check_positive_int(type(self).__name__, var_freeze_step=var_freeze_step,
                           var_update_scaler=var_update_scaler,
                           local_step_scaler=local_step_scaler,
                           local_step_clipper=local_step_clipper)
        self.var_freeze_step = var_freeze_step
        self.var_update_scaler = var_update_scaler
        self.local_step_scaler = local_step_scaler
        self.local_step_clipper = local_step_clipper
        self.eps_inside_sqrt = bool(eps_inside_sqrt)
        self._var_steps = frozenset(variance_steps(var_freeze_step, var_update_scaler))
        self.sync_schedule = SyncSchedule(var_freeze_step, local_step_scaler, local_step_clipper)
        defaults = dict(lr=lr, bias_correction=bias_correction, betas=tuple(betas), eps=eps,
                        weight_decay=weight_decay)
        super().__init__(params, defaults, deepspeed=deepspeed, amsgrad=amsgrad,
                         max_grad_norm=max_grad_norm, cuda_aware=cuda_aware,
                         comm_backend_name=comm_backend_name)

    def is_variance_step(self, step):
        return step in self._var_steps

    def full_precision_reduction(self, step):
        return self.is_variance_step(step)

    def _state(self, param):
        state = self.state[param]
        if not state:
            state["exp_avg"] = torch.zeros_like(param, dtype=torch.float32)
            state["exp_avg_sq"] = torch.zeros_like(param, dtype=torch.float32)
            state["var_updates"] = 0
        return state

    def _denom(self, state, group):
        return adam_denominator(state["exp_avg_sq"], state["var_updates"], group["betas"][1],
                                group["eps"], self.eps_inside_sqrt, group["bias_correction"])

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        step = self._advance()
        params = self.params_in_order()
        states = [self._state(p) for p in params]
        groups = [g for g in self.param_groups for _ in g["params"]]
        if step <= self.var_freeze_step:
            self._variance_phase(step, params, states, groups)
        else:
            self._local_phase(step, params, states, groups)
        self._set_reduction()
        return loss

    def _variance_phase(self, step, params, states, groups):
        if self.is_variance_step(step):  # gradients arrive averaged in full precision
            grads = [self.grad_of(p) for p in params]
        else:
            grads = self.compressed_average([self.grad_of(p) for p in params])
        for param, state, group, grad in zip(params, states, groups, grads):
            beta1, beta2 = group["betas"]
            state["exp_avg"].lerp_(grad, 1.0 - beta1)
            if self.is_variance_step(step):
                state["exp_avg_sq"].mul_(beta2).addcmul_(grad, grad, value=1.0 - beta2)
                state["var_updates"] += 1
            else:
                self.apply_mask(group, state["exp_avg"], param)
            adam_apply_(param, state["exp_avg"], self._denom(state, group), step, group["lr"],
                        beta1, group["weight_decay"], group["bias_correction"])

    def _local_phase(self, step, params, states, groups):
        if step == self.var_freeze_step + 1:
            self.reset_errors()  # they held gradient errors; from now on they hold updates'
        for param, state, group in zip(params, states, groups):
            if "sync_base" not in state:
                state["sync_base"] = param.detach().float().clone()
                state["lr_sum"] = 0.0
            beta1 = group["betas"][0]
            state["exp_avg"].lerp_(self.grad_of(param), 1.0 - beta1)
            adam_apply_(param, state["exp_avg"], self._denom(state, group), step, group["lr"],
                        beta1, group["weight_decay"], group["bias_correction"])
            state["lr_sum"] += group["lr"]
        if not self.sync_schedule.is_sync(step):
            return
        moved = [s["sync_base"] - p.detach().float() for p, s in zip(params, states)]
        averaged = self.compressed_average(moved)
        for param, state, group, avg in zip(params, states, groups, averaged):
            base = state["sync_base"]
            param.copy_(base - avg)
            if state["lr_sum"] > 0:
                momentum = (avg / state["lr_sum"]).sub_(base, alpha=group["weight_decay"])
                momentum.mul_(self._denom(state, group))
                if group["bias_correction"]:
                    momentum.mul_(1.0 - group["betas"][0] ** step)
                state["exp_avg"].copy_(momentum)
            self.apply_mask(group, state["exp_avg"], param)
            base.copy_(param)
            state["lr_sum"] = 0.0

    def _reset_local_buffers(self):
        for param in self.params_in_order():
            state = self.state.get(param, {})
            if "sync_base" in state:
                state["sync_base"].copy_(param.detach())
                state["lr_sum"] = 0.0
