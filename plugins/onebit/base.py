"""What the three 1-bit optimizers share: argument checks, the transport and compressor, the
switch that tells the engine whether to all-reduce gradients, the momentum mask, and the
checkpoint rules.

The engine asks ``enable_backward_allreduce`` (through the plugin's
``deepspeed_reduce_gradients`` hook) before each step's reduction: True during warm-up, when the
optimizer needs the averaged full-precision gradient; False once the momentum exchange replaces
the gradient all-reduce. The optimizer sets it at the end of each step for the next one, from the
step count alone, so every rank agrees without talking. (Upstream's optimizers flip the same
attribute on the engine; it is mirrored there for code that reads it.)

Checkpoints: ``state_dict`` holds the Adam/LAMB state and step counters, never the compression
errors (each rank's are different and as large as the model) nor ``exp_avg_mask`` (it must be
passed again in the param groups of every run, as the tutorials say). ``load_state_dict`` resets
the errors to zero and keeps the masks of the param groups it was built with.
"""
import torch

from deepspeed import comm as dist
from deepspeed.ops.optimizer_base import DeepSpeedOptimizer
from deepspeed.onebit.compressed import CompressedAllreduce
from deepspeed.onebit.transports import BACKENDS, make_transport

MASK_KEY = "exp_avg_mask"


def check_positive_int(owner, **values):
    for key, value in values.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{owner}: {key} must be a positive integer, got {value!r}")


class OneBitOptimizer(DeepSpeedOptimizer):
    """Base of ``OnebitAdam``, ``ZeroOneAdam`` and ``OnebitLamb`` (not used alone)."""

    def __init__(self, params, defaults, deepspeed=None, amsgrad=False, max_grad_norm=0.0,
                 cuda_aware=False, comm_backend_name="nccl"):
        name = type(self).__name__
        if amsgrad:
            raise RuntimeError(f"{name} does not support the AMSGrad variant.")
        if max_grad_norm:
            raise ValueError(f"{name}: max_grad_norm={max_grad_norm} is not supported; use the "
                             f"top-level 'gradient_clipping' config key instead")
        if str(comm_backend_name).lower() not in BACKENDS:
            raise ValueError(f"{name}: comm_backend_name '{comm_backend_name}' is not a 1-bit "
                             f"communication backend; allowed: {', '.join(BACKENDS)}")
        lr, eps, (beta1, beta2) = defaults["lr"], defaults["eps"], defaults["betas"]
        if lr < 0 or eps < 0 or not (0 <= beta1 < 1 and 0 <= beta2 < 1):
            raise ValueError(f"{name}: need lr >= 0, eps >= 0 and betas in [0, 1), got lr={lr}, "
                             f"eps={eps}, betas={defaults['betas']}")
        if not dist.is_initialized():
            raise RuntimeError(f"{name} exchanges momenta between ranks and needs "
                               f"deepspeed.comm initialised: call deepspeed.init_distributed() "
                               f"or build it through deepspeed.initialize")
        super().__init__(params, defaults)
        for group in self.param_groups:
            group.setdefault("step", 0)
        self.deepspeed = deepspeed
        self.comm_backend_name = str(comm_backend_name).lower()
        self.cuda_aware = bool(cuda_aware)
        group = deepspeed.dp_group if deepspeed is not None else None
        self.transport = make_transport(self.comm_backend_name, self.cuda_aware, group)
        self.world_size = self.transport.world_size
        self._compressor = None
        self.enable_backward_allreduce = True
        self._set_reduction()

    # ------------------------------------------------------------------ subclass interface
    def full_precision_reduction(self, step):
        """Whether the gradients of ``step`` (1-based) must be all-reduced in full precision."""
        raise NotImplementedError

    def _reset_local_buffers(self):
        """Subclass buffers a checkpoint load invalidates (0/1 Adam's local-step buffers)."""

    def reset_after_load(self):
        """Zero the compression errors and the local buffers, and re-derive whether the next
        step all-reduces, after the parameters or the state were loaded from a checkpoint."""
        self.reset_errors()
        self._reset_local_buffers()
        self._set_reduction()

    # ------------------------------------------------------------------ shared machinery
    @property
    def step_count(self):
        """Steps taken so far (the same in every param group)."""
        return self.param_groups[0]["step"] if self.param_groups else 0

    def _advance(self):
        for group in self.param_groups:
            group["step"] += 1
        return self.step_count

    def _begin_step(self, closure):
        """``(loss, step)``: the closure's loss (evaluated with gradients on, as torch's
        optimizers do) and the number of the step this call takes."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        return loss, self._advance()

    def _moment_state(self, param, **entries):
        """``param``'s state, created on first use: fp32 Adam moments plus the optimizer's own
        ``entries``."""
        state = self.state[param]
        if not state:
            state["exp_avg"] = torch.zeros_like(param, dtype=torch.float32)
            state["exp_avg_sq"] = torch.zeros_like(param, dtype=torch.float32)
            state.update(entries)
        return state

    def _set_reduction(self):
        enabled = bool(self.full_precision_reduction(self.step_count + 1))
        self.enable_backward_allreduce = enabled
        if self.deepspeed is not None:
            self.deepspeed.enable_backward_allreduce = enabled

    def params_in_order(self):
        """Every parameter of every group, in group order: the same list on every rank, so the
        compressed exchange pairs up even when a rank has no gradient for some of them."""
        return [p for group in self.param_groups for p in group["params"]]

    @property
    def compressor(self):
        """The ``CompressedAllreduce`` over all parameters' shapes, built at first use."""
        if self._compressor is None:
            params = self.params_in_order()
            device = params[0].device if params else torch.device("cpu")
            self._compressor = CompressedAllreduce(self.transport, [p.shape for p in params],
                                                   device)
        return self._compressor

    def compressed_average(self, tensors):
        """The 1-bit error-compensated average of ``tensors`` (one per parameter)."""
        return self.compressor(tensors)

    def reset_errors(self):
        if self._compressor is not None:
            self._compressor.reset_errors()

    @staticmethod
    def grad_of(param):
        """The parameter's gradient in fp32, zeros when it has none this step."""
        if param.grad is None:
            return torch.zeros_like(param, dtype=torch.float32)
        if param.grad.is_sparse:
            raise RuntimeError("1-bit optimizers do not support sparse gradients")
        return param.grad.float()

    @staticmethod
    def apply_mask(group, exp_avg, param):
        """Zero the momentum where the group's ``exp_avg_mask`` is 0 (entries whose gradient is
        always 0, which 1-bit compression cannot represent)."""
        mask = group.get(MASK_KEY)
        if mask is None:
            return
        if mask.device != exp_avg.device or mask.dtype != exp_avg.dtype:
            mask = mask.to(device=exp_avg.device, dtype=exp_avg.dtype)
            group[MASK_KEY] = mask
        try:
            exp_avg.mul_(mask)
        except RuntimeError as exc:
            raise ValueError(f"param group {MASK_KEY} of shape {tuple(mask.shape)} does not "
                             f"broadcast to parameter of shape {tuple(param.shape)}") from exc

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self):
        saved = super().state_dict()
        for group in saved["param_groups"]:
            group.pop(MASK_KEY, None)  # never restored: passed again by every run
        return saved

    def load_state_dict(self, state_dict):
        masks = [group.get(MASK_KEY) for group in self.param_groups]
        groups = [{k: v for k, v in g.items() if k != MASK_KEY}
                  for g in state_dict["param_groups"]]
        super().load_state_dict(dict(state_dict, param_groups=groups))
        for group, mask in zip(self.param_groups, masks):
            group.pop(MASK_KEY, None)
            if mask is not None:
                group[MASK_KEY] = mask
        self.reset_after_load()
