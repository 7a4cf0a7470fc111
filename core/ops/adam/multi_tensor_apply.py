"""The bookkeeping every DeepSpeed optimizer shares, so each one only states its update math.

An update is applied to *buckets*: the parameters of one param group that share a device, a dtype
and a step count, with their gradients and state tensors, as parallel lists. One bucket is one
``torch._foreach_*`` launch per operation, which is what upstream's multi-tensor apply buys on a
GPU and what a native kernel will later take over. Half-precision tensors are upcast to fp32 for
the arithmetic and written back, as the fused kernels do in registers.
"""
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Sequence

import torch

from deepspeed.ops.optimizer_base import DeepSpeedOptimizer

HALF_AND_FLOAT = (torch.float16, torch.bfloat16, torch.float32)


@dataclass
class Bucket:
    """Parallel lists for one foreach launch; ``step`` is the (shared) step count after this
    step's increment."""
    params: List[torch.Tensor]
    grads: List[torch.Tensor]
    states: Dict[str, List[torch.Tensor]] = field(default_factory=dict)
    step: int = 0

    def fp32(self) -> "Bucket":
        """The same bucket with every tensor in fp32 (the originals where they already are)."""
        return Bucket(_fp32(self.params), _fp32(self.grads),
                      {key: _fp32(values) for key, values in self.states.items()}, self.step)

    def subset(self, keep: Sequence[int]) -> "Bucket":
        """The entries at positions ``keep`` (the same tensors, not copies)."""
        return Bucket([self.params[i] for i in keep], [self.grads[i] for i in keep],
                      {key: [values[i] for i in keep] for key, values in self.states.items()},
                      self.step)

    def write_back(self, computed: "Bucket") -> None:
        """Copy params and states computed in fp32 back into lower-precision originals."""
        _copy_where_distinct(self.params, computed.params)
        for key, values in self.states.items():
            _copy_where_distinct(values, computed.states[key])


def _fp32(tensors: Sequence[torch.Tensor]) -> List[torch.Tensor]:
    return [t if t.dtype == torch.float32 else t.float() for t in tensors]


def _copy_where_distinct(targets, computed):
    pairs = [(t, c) for t, c in zip(targets, computed) if t is not c]
    if pairs:
        torch._foreach_copy_([t for t, _ in pairs], [c for _, c in pairs])


def check_hyperparameters(name: str, lr=None, eps=None, betas=None, weight_decay=None):
    """Reject values that make the update meaningless at construction, naming the argument,
    rather than producing NaNs many steps later."""
    if lr is not None and not 0.0 <= lr:
        raise ValueError(f"{name}: invalid learning rate lr={lr} (must be >= 0)")
    if eps is not None and not 0.0 <= eps:
        raise ValueError(f"{name}: invalid epsilon eps={eps} (must be >= 0)")
    if betas is not None:
        if len(betas) != 2:
            raise ValueError(f"{name}: betas={betas!r} must be a pair (beta1, beta2)")
        for index, beta in enumerate(betas):
            if not 0.0 <= beta < 1.0:
                raise ValueError(f"{name}: invalid beta at index {index}: {beta} "
                                 f"(must be in [0, 1))")
    if weight_decay is not None and not 0.0 <= weight_decay:
        raise ValueError(f"{name}: invalid weight_decay={weight_decay} (must be >= 0)")


def fp16_targets(param_groups, fp16_param_groups):
    """(param, 16-bit copy) pairs of ``step(fp16_param_groups=...)``: one tensor, or one list of
    tensors per param group matching it in length. Empty when no copies were asked for."""
    if fp16_param_groups is None:
        return []
    if torch.is_tensor(fp16_param_groups):
        fp16_param_groups = [[fp16_param_groups]]
    pairs = []
    groups = per_group(fp16_param_groups, len(param_groups), "fp16_param_groups")
    for group, targets in zip(param_groups, groups):
        if len(targets) != len(group["params"]):
            raise ValueError(f"fp16_param_groups: {len(targets)} tensors for a group of "
                             f"{len(group['params'])} params")
        pairs.extend(zip(group["params"], targets))
    return pairs


def per_group(argument, num_groups: int, what: str) -> list:
    """Normalise a legacy per-group step argument (``grads``, ``output_params``): None, one flat
    list for a single group, or one list per group."""
    if argument is None:
        return [None] * num_groups
    argument = list(argument)
    if argument and not isinstance(argument[0], (list, tuple)):
        argument = [argument]
    if len(argument) != num_groups:
        raise ValueError(f"{what}: got {len(argument)} groups for {num_groups} param groups")
    return argument


class MultiTensorOptimizer(DeepSpeedOptimizer):
    """Base of FusedAdam, DeepSpeedCPUAdam, FusedLamb, the Lion and Adagrad optimizers.

    Subclasses set ``state_keys`` (the zero-initialised state tensors), ``per_param_step``
    (the CPU optimizers count steps per tensor in ``state['step']``; the fused ones per group in
    ``group['step']``, which ZeRO-3 sets on its sub-groups) and ``allowed_dtypes``.
    """

    state_keys: Sequence[str] = ()
    per_param_step = False
    allowed_dtypes: Optional[Sequence[torch.dtype]] = HALF_AND_FLOAT
    fp32_optimizer_states = False

    def _state_dtype(self, param):
        return torch.float32 if self.fp32_optimizer_states else param.dtype

    def _check_param(self, param, grad):
        name = type(self).__name__
        if grad.is_sparse:
            raise RuntimeError(f"{name} does not support sparse gradients")
        if self.allowed_dtypes is not None and param.dtype not in self.allowed_dtypes:
            allowed = ", ".join(str(d).replace("torch.", "") for d in self.allowed_dtypes)
            raise RuntimeError(f"{name} only supports {allowed} parameters, got {param.dtype}")

    def buckets(self, group, grads=None) -> List[Bucket]:
        """Initialise missing state, advance the step counts and bucket this group's params
        that have a gradient (``grads`` overrides ``p.grad``, same order as the params)."""
        grads = grads if grads is not None else [p.grad for p in group["params"]]
        if not self.per_param_step:
            group["step"] = group.get("step", 0) + 1
            reused = self._reuse_layout(group, grads)
            if reused is not None:
                return reused
        found: Dict[tuple, Bucket] = {}
        for param, grad in zip(group["params"], grads):
            if grad is None:
                continue
            self._check_param(param, grad)
            state = self.state[param]
            if not state:
                self._init_state(param, state)
            if self.per_param_step:
                state["step"] = state.get("step", 0) + 1
                step = state["step"]
            else:
                step = group["step"]
            key = (param.device, param.dtype, step)
            bucket = found.get(key)
            if bucket is None:
                bucket = found[key] = Bucket([], [], {k: [] for k in self.state_keys}, step)
            bucket.params.append(param)
            bucket.grads.append(grad)
            for k in self.state_keys:
                bucket.states[k].append(state[k])
        buckets = list(found.values())
        if not self.per_param_step:
            self._remember_layout(group, grads, buckets)
        return buckets

    # The bucketing of a group whose params all have gradients is the same every step, and
    # recomputing it per parameter (dtype checks, device objects, dict lookups) is host time
    # the GPU waits for: on an H200, FusedAdam.step over 200 bf16 tensors took 1.52 ms while
    # the same kernel fed ready lists (more bytes: fp32 moments) took 0.85 ms. The layout
    # (which positions go to which bucket) is kept per group and reused while the group holds
    # the same params; gradients and state tensors are read afresh every step (ZeRO and
    # load_state_dict replace them).
    def _remember_layout(self, group, grads, buckets):
        if any(g is None for g in grads):
            return  # a partial step: recomputed each time
        live = {id(g) for g in self.param_groups}  # groups rebuilt by a caller are dropped
        layouts = self._layout_cache()
        for stale in [key for key in layouts if key not in live]:
            del layouts[stale]
        position = {id(p): i for i, p in enumerate(group["params"])}
        layout = [[position[id(p)] for p in bucket.params] for bucket in buckets]
        layouts[id(group)] = (group["params"], tuple(map(id, group["params"])), layout,
                              [(bucket.params, bucket.params[0].dtype) for bucket in buckets])

    def _layout_cache(self):
        # not set in __init__: torch's Optimizer pickling and load paths build instances
        # without it
        return self.__dict__.setdefault("_layouts", {})

    def _reuse_layout(self, group, grads):
        cached = self._layout_cache().get(id(group))
        if cached is None:
            return None
        params_list, ids, layout, bucket_params = cached
        params = group["params"]
        if params_list is not params or tuple(map(id, params)) != ids \
                or any(g is None or g.is_sparse for g in grads):
            return None
        step, state = group["step"], self.state
        out = []
        for positions, (bucket_of, dtype) in zip(layout, bucket_params):
            entries = [state.get(param) for param in bucket_of]
            # state dropped (a load of another run), or a param converted: rebucket
            if not all(entries) or not all(param.dtype is dtype for param in bucket_of):
                return None
            states = {key: [entry[key] for entry in entries] for key in self.state_keys}
            out.append(Bucket(list(bucket_of), [grads[i] for i in positions], states, step))
        return out

    def _init_state(self, param, state):
        if self.per_param_step:
            state["step"] = 0
        for key in self.state_keys:
            state[key] = torch.zeros_like(param, dtype=self._state_dtype(param),
                                          memory_format=torch.preserve_format)

    def apply_fp32(self, bucket: Bucket, update: Callable[[Bucket], object]):
        """Run ``update`` on an fp32 view of ``bucket`` and write the results back."""
        computed = bucket.fp32()
        result = update(computed)
        bucket.write_back(computed)
        return result

    @staticmethod
    def run_closure(closure):
        if closure is None:
            return None
        with torch.enable_grad():
            return closure()

    def load_state_dict(self, state_dict):
        """torch casts loaded state to each param's dtype; with ``fp32_optimizer_states`` the
        moments must stay fp32 (bf16 params, fp32 Adam moments), so restore them from the
        saved values rather than from the down-cast copies."""
        super().load_state_dict(state_dict)
        if not self.fp32_optimizer_states:
            return
        params = [p for group in self.param_groups for p in group["params"]]
        ids = [i for group in state_dict["param_groups"] for i in group["params"]]
        for param, saved_id in zip(params, ids):
            for key, value in state_dict["state"].get(saved_id, {}).items():
                if key in self.state_keys and torch.is_tensor(value):
                    self.state[param][key] = value.to(device=param.device, dtype=torch.float32)


class CPUOptimizerMixin:
    """What the DeepSpeed CPU optimizers (ZeRO-Offload's) add: params must live on the host,
    and ``step(fp16_param_groups=...)`` copies the updated fp32 values into device copies in
    the same call."""

    per_param_step = True
    allowed_dtypes = HALF_AND_FLOAT

    def _check_param(self, param, grad):
        if param.device.type != "cpu":
            raise AssertionError(
                f"{type(self).__name__} param is on {param.device} and must be 'cpu', make sure "
                f"you enabled 'offload_optimizer': 'cpu' in your ZeRO config.")
        super()._check_param(param, grad)

    def copy_to_fp16_groups(self, fp16_param_groups):
        with torch.no_grad():
            for param, target in fp16_targets(self.param_groups, fp16_param_groups):
                if param.grad is not None:
                    target.copy_(param.view_as(target), non_blocking=True)
