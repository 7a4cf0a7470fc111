"""The engine's precision policy: who holds the weights the optimizer steps, and in what dtype.

- ``FullPrecision`` (fp32): the optimizer steps the model's own parameters.
- ``MixedPrecisionOptimizer`` (fp16 / bf16): the model computes in 16 bits while the optimizer
  steps fp32 *master* copies; gradients are copied (and, for fp16, unscaled and checked for
  overflow) into the masters, and the updated masters are copied back into the model.

Both implement ``deepspeed.hooks.PrecisionPolicy``, so ``DeepSpeedEngine.step`` reads the same
for every precision; a plugin that owns the optimizer (ZeRO) implements the same protocol over
its partitions.
"""
import torch

from deepspeed import comm as dist
from deepspeed.hooks import GRADIENT_NORM_GROUP, REPLICATED_PARAM
from deepspeed.precision.loss_scaler import log_overflow
from deepspeed.precision.overflow import has_inf_or_nan, overflow_anywhere


def _grads(params):
    return [p.grad for p in params if p.grad is not None]


def clip_local_grad_norm(params, max_norm, norm_group=None, counted=None, shared=()):
    """Clip the gradients of ``params`` (held whole on this rank) to ``max_norm``; returns the
    total norm measured before clipping, the same on every rank. With ``norm_group`` the norm
    is over the gradients of ``counted`` (default ``params``) on every rank of the group
    (pipeline stages each holding other parameters). ``shared`` lists ``(group, tensors)``
    whose squares are summed over ``group`` (the ranks holding *other* copies of them: experts
    declaring ``deepspeed.hooks.GRADIENT_NORM_GROUP``) before joining the local sum. Every rank
    scales its own gradients by the same factor."""
    if norm_group is None and not shared:
        return float(torch.nn.utils.clip_grad_norm_(params, max_norm))
    counted = params if counted is None else counted
    kept = {id(t) for t in counted}
    apart = {id(t) for _, tensors in shared for t in tensors}
    squares = _squares([t for t in counted if id(t) not in apart])
    for group, tensors in shared:  # the same groups in the same order on every rank
        part = _squares([t for t in tensors if id(t) in kept])
        dist.all_reduce(part, group=group)
        squares += part
    if norm_group is not None:
        dist.all_reduce(squares, group=norm_group)
    total = float(squares.sqrt())
    coef = max_norm / (total + 1e-6)
    if coef < 1.0:
        mine = [p.grad for p in params if p.grad is not None]
        if mine:
            torch._foreach_mul_(mine, coef)
    return total


def _squares(tensors):
    """Sum of the squared gradients of ``tensors`` as a float64 CPU scalar tensor."""
    squares = torch.zeros((), dtype=torch.float64)
    for tensor in tensors:
        if tensor.grad is not None:
            squares += tensor.grad.detach().double().pow(2).sum().cpu()
    return squares


def _counted(pairs):
    """The stepped tensors whose model parameter is not another rank's counted copy."""
    return [stepped for model, stepped in pairs if not getattr(model, REPLICATED_PARAM, False)]


def _shared(pairs):
    """``[(group, stepped tensors)]`` for model parameters declaring ``GRADIENT_NORM_GROUP``,
    grouped by that group in first-seen order (the same on every rank); ``[]`` when none do.
    Read at each clip: an MoE layer may tag its experts after the engine was built."""
    out = {}
    for model, stepped in pairs:
        group = getattr(model, GRADIENT_NORM_GROUP, None)
        if group is not None:
            out.setdefault(id(group), (group, []))[1].append(stepped)
    return list(out.values())


class FullPrecision:
    """fp32 training: nothing to copy, nothing to scale."""

    loss_scale = 1.0

    def __init__(self, module, optimizer):
        self.module = module
        self.optimizer = optimizer
        # walked every step: listing module.parameters() each time costs ~50 us per walk
        self._params = list(module.parameters())

    def scale_loss(self, loss):
        return loss

    def accumulate_micro_grads(self):
        """Gradients accumulate in place in ``param.grad``."""

    def reduction_grads(self):
        return _grads(self._params)

    def unscale_grads(self):
        return True

    def master_params(self):
        return [p for p in self._params if p.grad is not None]

    def model_param_of(self, stepped):
        """The optimizer steps the model's own parameters."""
        return stepped

    def clip_grad_norm(self, max_norm, norm_group=None):
        params = self.master_params()
        return clip_local_grad_norm(params, max_norm, norm_group,
                                    _counted((p, p) for p in params),
                                    _shared((p, p) for p in self._params))

    def optimizer_step(self):
        self.optimizer.step()

    def after_optimizer_step(self):
        """The optimizer updated the model's parameters directly."""

    def update_scale(self, overflow):
        """No loss scale to move."""

    def zero_grad(self):
        # every module parameter, also those the optimizer does not own (frozen / excluded)
        for param in self._params:
            param.grad = None


class OptimizerFace:
    """What users and LR schedulers see of an optimizer that wraps another (``self.optimizer``)
    and may own a loss scaler (``self.loss_scaler``): fp16/bf16 masters here, ZeRO's
    partitions in the zero plugin."""

    @property
    def param_groups(self):
        return self.optimizer.param_groups

    @property
    def state(self):
        return self.optimizer.state

    @property
    def defaults(self):
        return self.optimizer.defaults

    @property
    def cur_scale(self):
        return self.loss_scaler.cur_scale if self.loss_scaler is not None else 1.0

    @property
    def loss_scale(self):
        return self.cur_scale


class MixedPrecisionOptimizer(OptimizerFace):
    """Wraps an optimizer built over a 16-bit model so that it steps fp32 master weights.

    This is what ``deepspeed.initialize`` returns as the optimizer under fp16/bf16. Its
    ``state_dict`` carries the master weights and the loss scaler, so a resumed run continues
    bit-exactly instead of re-deriving fp32 weights from rounded 16-bit ones.
    """

    def __init__(self, optimizer, loss_scaler=None, fp32_grad_accumulation=False,
                 overflow_group=None, module=None, immediate_grad_update=False):
        self.optimizer = optimizer
        # parameters the optimizer does not own (frozen, or left out of ``model_parameters``)
        # still receive gradients: zero_grad clears those too, or they accumulate forever
        self._module_params = list(module.parameters()) if module is not None else []
        self.loss_scaler = loss_scaler
        self.fp32_grad_accumulation = fp32_grad_accumulation
        self.overflow_group = overflow_group
        self.overflow = False
        self._pairs = []  # (16-bit model param, fp32 master)
        for group in optimizer.param_groups:
            masters = []
            for param in group["params"]:
                master = torch.nn.Parameter(param.detach().float().clone(),
                                            requires_grad=param.requires_grad)
                if param in optimizer.state:  # a client optimizer that already stepped
                    optimizer.state[master] = optimizer.state.pop(param)
                self._pairs.append((param, master))
                masters.append(master)
            group["params"] = masters
        self._model_of = {id(master): param for param, master in self._pairs}
        # bf16.immediate_grad_update: each 16-bit gradient moves into its fp32 master's
        # accumulator from a hook as soon as backward produces it, so it is freed at once
        # instead of every parameter's staying alive until backward ends
        self._grad_hooks = []
        if immediate_grad_update:
            if not fp32_grad_accumulation:
                raise ValueError(
                    "bf16.immediate_grad_update moves each bf16 gradient into the fp32 "
                    "accumulation buffer as backward produces it, but gradients accumulate in "
                    "bf16 here; set data_types.grad_accum_dtype to \"fp32\" or leave "
                    "immediate_grad_update false")
            for param, master in self._pairs:
                if param.requires_grad:
                    self._grad_hooks.append(param.register_post_accumulate_grad_hook(
                        _GradMover(master)))

    def step(self, closure=None):
        """Step the masters and refresh the model; the engine calls ``unscale_grads`` first."""
        result = self.optimizer.step(closure)
        self.after_optimizer_step()
        return result

    def state_dict(self):
        return {"optimizer_state_dict": self.optimizer.state_dict(),
                "fp32_master_weights": [m.detach().clone() for _, m in self._pairs],
                "loss_scaler": (self.loss_scaler.state_dict()
                                if self.loss_scaler is not None else None),
                "overflow": self.overflow}

    def load_state_dict(self, state_dict):
        self.optimizer.load_state_dict(state_dict["optimizer_state_dict"])
        saved = state_dict["fp32_master_weights"]
        if len(saved) != len(self._pairs):
            raise ValueError(f"checkpoint holds {len(saved)} fp32 master weights, this optimizer "
                             f"has {len(self._pairs)} parameters")
        with torch.no_grad():
            for (_, master), value in zip(self._pairs, saved):
                master.copy_(value)
        self.after_optimizer_step()
        if self.loss_scaler is not None and state_dict.get("loss_scaler") is not None:
            self.loss_scaler.load_state_dict(state_dict["loss_scaler"])
        self.overflow = bool(state_dict.get("overflow", False))

    def refresh_fp32_params(self):
        """Re-derive the masters from the model after its 16-bit weights were loaded alone
        (``load_module_only`` / no optimizer states), so the next step does not undo the load."""
        with torch.no_grad():
            for param, master in self._pairs:
                master.copy_(param.float())

    # ---- the precision protocol the engine drives
    def scale_loss(self, loss):
        # in fp32: a 16-bit loss times 2**16 would overflow before backward even starts
        return loss.float() * self.cur_scale if self.loss_scaler is not None else loss

    def accumulate_micro_grads(self):
        """With fp32 accumulation, move each micro-batch's 16-bit gradient into the master
        (with ``immediate_grad_update`` the hooks already did, and ``param.grad`` is None)."""
        if not self.fp32_grad_accumulation:
            return
        for param, master in self._pairs:
            _move_grad(param, master)

    def destroy(self):
        """Remove the gradient hooks this policy put on the model's parameters."""
        for handle in self._grad_hooks:
            handle.remove()
        self._grad_hooks = []

    def reduction_grads(self):
        if self.fp32_grad_accumulation:
            return _grads(m for _, m in self._pairs)
        return _grads(p for p, _ in self._pairs)

    def unscale_grads(self):
        """Copy gradients into the masters in fp32 and unscale them; False on inf/nan."""
        if not self.fp32_grad_accumulation:
            for param, master in self._pairs:
                master.grad = None if param.grad is None else param.grad.float()
        grads = _grads(self.master_params())
        if self.loss_scaler is None:
            self.overflow = False
            return True
        if grads and self.cur_scale != 1.0:
            torch._foreach_mul_(grads, 1.0 / self.cur_scale)
        self.overflow = overflow_anywhere(has_inf_or_nan(grads), self.overflow_group,
                                          device=grads[0].device if grads else None)
        return not self.overflow

    def master_params(self):
        return [m for _, m in self._pairs]

    def model_param_of(self, stepped):
        """The 16-bit parameter whose fp32 master ``stepped`` is."""
        return self._model_of.get(id(stepped))

    def clip_grad_norm(self, max_norm, norm_group=None):
        return clip_local_grad_norm(self.master_params(), max_norm, norm_group,
                                    _counted(self._pairs), _shared(self._pairs))

    def optimizer_step(self):
        self.optimizer.step()

    def after_optimizer_step(self):
        with torch.no_grad():
            models = [p for p, _ in self._pairs]
            masters = [m for _, m in self._pairs]
            if models:
                torch._foreach_copy_(models, masters)

    def update_scale(self, overflow):
        if self.loss_scaler is None:
            return
        attempted = self.loss_scaler.cur_scale
        self.loss_scaler.update_scale(overflow)
        rank = dist.get_rank() if dist.is_initialized() else 0
        if overflow and rank == 0:
            log_overflow(rank, attempted, self.loss_scaler.cur_scale)

    def zero_grad(self, set_to_none=True):
        for param, master in self._pairs:
            param.grad = None
            master.grad = None
        for param in self._module_params:
            param.grad = None


def _move_grad(param, master):
    """Add ``param``'s 16-bit gradient to ``master``'s fp32 one and free it."""
    if param.grad is None:
        return
    if master.grad is None:
        master.grad = param.grad.float()
    else:
        master.grad.add_(param.grad)
    param.grad = None


class _GradMover:
    """The post-accumulate-grad hook of ``immediate_grad_update`` (a class, so the hook holds
    its master and nothing else)."""

    def __init__(self, master):
        self.master = master

    def __call__(self, param):
        with torch.no_grad():
            _move_grad(param, self.master)


class FP16Optimizer(MixedPrecisionOptimizer):
    """fp16 training: fp32 masters and a loss scaler. Upstream's class of this job is
    ``deepspeed.runtime.fp16.fused_optimizer.FP16_Optimizer``, which names this one."""


class BF16Optimizer(MixedPrecisionOptimizer):
    """bf16 training: fp32 masters, no loss scaling. Upstream's class of this job is
    ``deepspeed.runtime.bf16_optimizer.BF16_Optimizer``, which names this one."""
