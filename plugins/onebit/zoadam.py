"""0/1 Adam (arXiv 2202.06009): adaptive variance freezing plus local steps.

Up to ``var_freeze_step``:

- at the variance-update steps (``deepspeed.onebit.schedules``) the engine all-reduces gradients
  in full precision and the step is plain Adam (``m`` and ``v`` both move);
- at every other step the engine skips its all-reduce; the ranks average their local gradients
  with the 1-bit error-compensated all-reduce, and only ``m`` moves (``v`` stays).

After ``var_freeze_step`` (``v`` frozen for good; the error buffers are reset once):

- every step is local: each rank moves ``m`` with its own gradient and applies the Adam update
  to its own copy of the parameters, with no communication at all;
- each rank also accumulates its momentum, lr-scaled: ``u += lr_t * m`` (``lr_t`` includes the
  bias correction ``1 / (1 - beta1^t)``), and ``sum(lr_t)``;
- at the synchronisation steps the ranks average ``u`` with the 1-bit all-reduce (the paper's
  algorithm: the *momentum* is what is compressed, not the preconditioned update), set
  ``p = sync_base * prod(1 - lr * wd) - average / denom`` (the same bits on every rank: the
  decoupled weight decay of the local steps is applied to ``sync_base``, an approximation over one
  interval) and ``m = average / sum(lr_t)``.

  Why not compress the update ``sync_base - p`` directly: an entry whose gradient is always 0
  (a key bias in attention, a dead input) has ``v ~ 0`` but picks up 1-bit noise in ``m`` during
  the compressed warm-up, so its update ``m / (sqrt(v) + eps)`` is ~1e4 times the others'. It is
  harmless there (the loss does not depend on it), but compressed with one scale per tensor it
  swamps the tensor's other entries and the model diverges after ``var_freeze_step``. Momenta
  have comparable sizes, so compressing them keeps the scales meaningful.

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
        return self._moment_state(param, var_updates=0)

    def _denom(self, state, group):
        return adam_denominator(state["exp_avg_sq"], state["var_updates"], group["betas"][1],
                                group["eps"], self.eps_inside_sqrt, group["bias_correction"])

    @torch.no_grad()
    def step(self, closure=None):
        loss, step = self._begin_step(closure)
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
            self.reset_errors()  # they held gradient errors; from now on they hold momenta's
        for param, state, group in zip(params, states, groups):
            if "sync_base" not in state:
                self._new_interval(state, param)
            beta1, lr, wd = group["betas"][0], group["lr"], group["weight_decay"]
            state["exp_avg"].lerp_(self.grad_of(param), 1.0 - beta1)
            adam_apply_(param, state["exp_avg"], self._denom(state, group), step, lr,
                        beta1, wd, group["bias_correction"])
            scaled_lr = lr / (1.0 - beta1 ** step) if group["bias_correction"] else lr
            state["momentum_accumulator"].add_(state["exp_avg"], alpha=scaled_lr)
            state["lr_sum"] += scaled_lr
            state["decay"] *= 1.0 - lr * wd
        if not self.sync_schedule.is_sync(step):
            return
        averaged = self.compressed_average([s["momentum_accumulator"] for s in states])
        for param, state, group, avg in zip(params, states, groups, averaged):
            base = state["sync_base"]
            # the local steps' decay and the averaged (un-preconditioned) momentum sum, applied
            # to the common starting point: the same bits on every rank
            param.copy_(torch.addcdiv(base * state["decay"], avg, self._denom(state, group),
                                      value=-1.0))
            if state["lr_sum"] > 0:
                state["exp_avg"].copy_(avg).div_(state["lr_sum"])
            self.apply_mask(group, state["exp_avg"], param)
            self._new_interval(state, param)

    @staticmethod
    def _new_interval(state, param):
        """Start a synchronisation interval at ``param``: nothing accumulated yet."""
        if "sync_base" in state:
            state["sync_base"].copy_(param.detach())
            state["momentum_accumulator"].zero_()
        else:
            state["sync_base"] = param.detach().float().clone()
            state["momentum_accumulator"] = torch.zeros_like(state["sync_base"])
        state["lr_sum"] = 0.0
        state["decay"] = 1.0

    def _reset_local_buffers(self):
        for param in self.params_in_order():
            state = self.state.get(param, {})
            if "sync_base" in state:
                self._new_interval(state, param)
