"""ZeRO-3 at run time: gather a module's parameters just before it runs, release them after.

Forward: a pre-hook on every module gathers its own parameters (and those registered with
``register_external_parameter``) with one all-gather for all of them, a post-hook releases
them. The order modules ran in during the first forward is recorded; later forwards use it to
start the all-gathers of the next modules early (asynchronously, one per module, at most
``stage3_prefetch_bucket_size`` elements ahead and ``stage3_max_live_parameters`` gathered in
total), so communication overlaps compute.

Backward: the post-hook wraps the module's outputs in an identity autograd function whose
backward gathers the module's parameters again before the module's own backward runs, and
prefetches the modules whose backward comes next (the trace walked down, same budget); each
trainable parameter is released as soon as its gradient has been taken by the reducer
(``gradient_reduction``, which reduce-scatters whole runs of parameters), anything else at the
end of backward. Modules whose parameters all persist need no backward gather.

A module marked with ``deepspeed.utils.set_z3_leaf_modules`` is gathered as one unit: its hooks
gather the whole subtree and the hooks of the modules under it stand aside, so a
mixture-of-experts block whose experts run unevenly across ranks still issues the same
collectives on every rank.
"""
from collections import deque
from collections.abc import Mapping

import torch

from deepspeed.utils.nested import map_tensors
from deepspeed.zero.partition_parameters import (ZeroParamStatus, by_partitioner, gather_params,
                                                 is_zero_param, release_params)
from deepspeed.zero.saved_views import SavedWeightViews
from deepspeed.zero.torch_patches import ATTRIBUTE_WATCH
from deepspeed.zero.z3_leaf_module import leaf_mark_edits, z3_leaf_module

EXTERNAL_PARAMS = "_ds_external_params"


class _GatherBeforeBackward(torch.autograd.Function):

    @staticmethod
    def forward(ctx, gather, *tensors):
        ctx.gather = gather
        out = tuple(t.detach() for t in tensors)
        return out if len(out) > 1 else out[0]

    @staticmethod
    def backward(ctx, *grads):
        ctx.gather()
        return (None, *grads)


def _tensors_in(value, wanted):
    """The tensors in a (nested list / tuple / dict) module output for which ``wanted`` holds."""
    if torch.is_tensor(value):
        return [value] if wanted(value) else []
    items = value.values() if isinstance(value, Mapping) else \
        value if isinstance(value, (list, tuple)) else ()
    return [t for item in items for t in _tensors_in(item, wanted)]


def _wrap_outputs(output, gather):
    """``output`` with its grad-requiring tensors routed through ``_GatherBeforeBackward``
    (nested lists, tuples and dicts, including HF ``ModelOutput``s, keep their type)."""
    found = _tensors_in(output, lambda t: t.requires_grad)
    if not found:
        return output
    wrapped = _GatherBeforeBackward.apply(gather, *found)
    wrapped = wrapped if isinstance(wrapped, tuple) else (wrapped,)
    mapping = {id(t): w for t, w in zip(found, wrapped)}
    return map_tensors(output, lambda t: mapping.get(id(t), t))


def register_external_parameter(module, parameter):
    """Declare that ``module``'s forward uses ``parameter`` although another module owns it,
    so it is gathered for ``module`` too."""
    if not isinstance(parameter, torch.nn.Parameter):
        raise RuntimeError(f"register_external_parameter needs a torch.nn.Parameter, got "
                           f"{type(parameter).__name__}")
    registry = module.__dict__.setdefault(EXTERNAL_PARAMS, {})
    registry[id(parameter)] = parameter
    _EXTERNAL_EDITS[0] += 1
    if "ds_external_parameters" not in module.__dict__:
        module.ds_external_parameters = lambda: list(registry.items())


def unregister_external_parameter(module, parameter):
    registry = module.__dict__.get(EXTERNAL_PARAMS, {})
    if id(parameter) not in registry:
        raise RuntimeError(f"parameter {getattr(parameter, 'ds_id', '?')} is not registered as "
                           f"external to {type(module).__name__}")
    del registry[id(parameter)]
    _EXTERNAL_EDITS[0] += 1


_EXTERNAL_EDITS = [0]  # bumped by every (un)registration: cached parameter lists go stale


def module_params(module):
    """The partitioned parameters ``module`` needs whole to run its own forward: its own and
    its external ones, or, for a ZeRO-3 leaf module, those of its whole subtree."""
    members = list(module.modules()) if z3_leaf_module(module) else [module]
    found = {}
    for member in members:
        for param in member._parameters.values():
            if param is not None and is_zero_param(param):
                found.setdefault(id(param), param)
        for param in member.__dict__.get(EXTERNAL_PARAMS, {}).values():
            if is_zero_param(param):
                found.setdefault(id(param), param)
    return list(found.values())


def _position_of(trace, module, start):
    """Index of ``module`` in ``trace`` from ``start`` on, or None. Not ``list.index``: its
    miss formats ``repr(module)`` into the ValueError, and a module's repr reads its
    parameters (``Linear.extra_repr`` reads ``self.bias``), which inside a forward would
    gather them as external parameters."""
    for index in range(start, len(trace)):
        if trace[index] is module:
            return index
    return None


class _Lookahead:
    """Prefetch progress of one pass over the trace: forward walks it up (``step`` +1),
    backward down (-1). ``modules``: at most this many modules gathered ahead at once."""

    def __init__(self, step, modules=None):
        self.step = step
        self.modules = modules
        self.reset()

    def reset(self):
        self.cursor = None  # the next trace index not yet looked at in this pass
        self.ahead = deque()  # (trace index, elements) prefetched for modules not yet reached


class ParameterCoordinator:
    """Installs and drives the gather/release hooks of one model."""

    def __init__(self, module, prefetch_bucket_size=50_000_000, max_live_parameters=1_000_000_000,
                 max_reuse_distance=1_000_000_000, memory_efficient_linear=True):
        self.module = module
        self.prefetch_bucket_size = int(prefetch_bucket_size)
        self.max_live_parameters = int(max_live_parameters)
        self.max_reuse_distance = int(max_reuse_distance)
        self._started_at = {}  # id(module) -> its index in the trace in the running forward
        self._reuse_distances = {}  # trace index -> distance to that module's next call
        self.trace = []  # modules in first-forward order
        self.trace_complete = False
        self._position = 0
        self._handles = []
        self._running = []  # modules inside their forward, innermost last
        # the outermost running ZeRO-3 leaf module: modules under it run on parameters it
        # gathered, so their own hooks stand aside
        self._leaf = None
        self._partitioners = []  # those owning the model's parameters (set by install)
        self._zero_params = []  # the model's partitioned parameters (set by install)
        self._params_cache = {}  # module -> (validity key, module_params(module))
        # backward begins at the step's activation peak: it prefetches one module ahead
        # (within the same budget), which hides the all-gather as well as going further did
        # (3.2M-parameter GPT, paired: one ahead 0.999-1.021x of the whole budget, none at all
        # 1.05x) without holding every layer whole at that moment (live peak 457 -> 444 MiB)
        self._forward_lookahead = _Lookahead(+1)
        self._backward_lookahead = _Lookahead(-1, modules=1)
        self.gathered_peak = 0  # most elements gathered at once (tests and tuning)
        self._prefetch_key = None  # what ``_prefetchable`` was decided for
        self._prefetchable = True
        # saved views of gathered weights do not keep them whole until backward
        # (``zero_optimization.memory_efficient_linear``; off: autograd's saved views of a
        # gathered weight keep it whole from the module's forward to its backward)
        self._saved_views = SavedWeightViews()
        self.memory_efficient_linear = bool(memory_efficient_linear)

    def install(self):
        for module in self.module.modules():
            self._handles.append(module.register_forward_pre_hook(self._pre_forward))
            self._handles.append(module.register_forward_hook(self._post_forward))
        params = [p for p in self.module.parameters() if is_zero_param(p)]
        self._zero_params = params
        for param in params:
            param.ds_coordinator = self
        self._partitioners = [partitioner for partitioner, _ in by_partitioner(params)]
        ATTRIBUTE_WATCH.install()
        return self

    def remove(self):
        """Detach from the model (the engine is being destroyed): module hooks, and the
        process-wide attribute watch once no other coordinator needs it."""
        if not self._handles:
            return
        for handle in self._handles:
            handle.remove()
        self._handles = []
        self._saved_views.unwind()
        ATTRIBUTE_WATCH.restore()

    # ------------------------------------------------------------------ hooks
    def _pre_forward(self, module, args):
        if module is self.module:  # a forward that raised may have left hooks entered
            self._saved_views.unwind()
        self._running.append(module)
        if self._leaf is not None:  # under a leaf: the leaf gathered everything
            return
        if z3_leaf_module(module):
            self._leaf = module
        if not self.trace_complete:
            self.trace.append(module)
        elif self._anything_to_prefetch():
            self._prefetch_after(module)
        params = self._params_of(module)
        if not params:
            return
        if self._all_persistent(module):  # never released by a hook: no use count needed
            if not all(p.ds_status is ZeroParamStatus.AVAILABLE for p in params):
                self._gather(params)  # the first forward: they become resident now
            return
        for param in params:  # a parameter shared with an enclosing module stays whole
            param.ds_active_sub_modules = getattr(param, "ds_active_sub_modules", 0) + 1
        self._gather(params)
        if self.memory_efficient_linear:
            self._saved_views.enter(module, params)

    def _post_forward(self, module, args, output):
        if self._running and self._running[-1] is module:
            self._running.pop()
        self._saved_views.exit(module)
        if self._leaf is not None:
            if self._leaf is not module:
                return None
            self._leaf = None
        params = self._params_of(module)
        if not params or self._all_persistent(module):
            # nothing of its own (a container, an activation), or only parameters that stay
            # whole until the step (never released, never gathered for backward)
            return None
        self._hand_over_returned_params(module, output)
        for param in params:
            param.ds_active_sub_modules = max(getattr(param, "ds_active_sub_modules", 1) - 1, 0)
        position = self._started_at.get(id(module))  # this call's place in the trace
        if not self._reused_within_distance(module):
            self._release([p for p in params if not p.ds_active_sub_modules])
        # persistent parameters stay whole until the step: backward needs no gather for them
        if torch.is_grad_enabled() and not all(p.ds_persist for p in params):
            return _wrap_outputs(output, lambda: self._before_backward(params, position))
        return None

    def _before_backward(self, params, position):
        """Backward reached the module whose forward ran at trace ``position``: gather its
        parameters (usually prefetched already) and prefetch those of the modules whose
        backward comes next, the ones before it in the trace."""
        self._gather(params)
        if position is not None:
            self._prefetch(self._backward_lookahead, position)

    def _reused_within_distance(self, module):
        """Whether ``module``'s parameters are used again before ``stage3_max_reuse_distance``
        elements of other parameters are gathered, so releasing them now would only cost a
        second all-gather. Two cases are known for certain on every rank alike: a forward
        that activation checkpointing re-runs during backward is followed at once by the same
        module's backward (distance 0; the reducer then releases each parameter once its
        gradient is taken); and a module the recorded forward order calls again later in the
        same forward, at the distance of the parameters of the modules in between."""
        if torch._C._current_graph_task_id() != -1:  # re-run inside backward
            self._started_at.pop(id(module), None)
            return self.max_reuse_distance > 0 and torch.is_grad_enabled()
        if self.max_reuse_distance <= 0:
            return False
        if not self.trace_complete:
            return False
        here = self._started_at.pop(id(module), None)
        if here is None:
            return False
        if here not in self._reuse_distances:  # the trace is fixed now: measure once
            self._reuse_distances[here] = self._distance_to_next_call(module, here)
        return self._reuse_distances[here] < self.max_reuse_distance

    def _distance_to_next_call(self, module, here):
        """Elements of partitioned parameters gathered between trace position ``here`` and the
        next call of ``module`` in the same forward (infinite when there is none)."""
        again = _position_of(self.trace, module, here + 1)
        if again is None:
            return float("inf")
        between = {id(p): p for m in self.trace[here + 1:again] for p in self._params_of(m)}
        return sum(p.ds_numel for p in between.values() if not p.ds_persist)

    def _hand_over_returned_params(self, module, output):
        """A module that returns one of its own parameters (``return out, self.bias``) hands
        it to its caller: it becomes an external parameter of the enclosing module, which
        keeps it whole until its own forward ends and gathers it for its backward."""
        if not self._running:
            return
        own = {id(p): p for p in module._parameters.values() if p is not None and is_zero_param(p)}
        returned = _tensors_in(output, lambda t: id(t) in own)
        parent = self._running[-1]
        for param in returned:
            if id(param) not in parent.__dict__.get(EXTERNAL_PARAMS, {}):
                register_external_parameter(parent, param)
                param.ds_active_sub_modules = getattr(param, "ds_active_sub_modules", 0) + 1

    def fetch_external(self, param):
        """``param`` was read as an attribute while a forward runs but is not gathered: it is
        used outside its owner's forward (tied embeddings, ``compute_logits(x,
        self.embed.weight)``). Gather it now and register it with the running module, so
        that module gathers it up front next time and around its backward."""
        module = self._leaf or self._running[-1]
        register_external_parameter(module, param)
        param.ds_active_sub_modules = getattr(param, "ds_active_sub_modules", 0) + 1
        self._gather([param])

    def end_of_forward(self):
        """Called after each engine forward: the first one completes the trace."""
        self.trace_complete = True
        self._saved_views.unwind()
        self._position = 0
        self._forward_lookahead.reset()
        self._started_at.clear()

    def end_of_backward(self):
        """Release whatever is still whole (frozen parameters gathered for backward, anything
        a skipped hook left behind)."""
        self._backward_lookahead.reset()
        self._release([p for p in self._zero_params if p.ds_status is not
                       ZeroParamStatus.NOT_AVAILABLE and not p.ds_persist])

    def empty_partition_cache(self):
        """Release every parameter that is whole now, persistent ones included (``engine.
        empty_partition_cache()``, between steps): only shards stay. Each is gathered again
        when next used, and a persistent one then stays whole as before."""
        self._saved_views.unwind()
        self._forward_lookahead.reset()
        self._backward_lookahead.reset()
        release_params([p for p in self._zero_params
                        if p.ds_status is not ZeroParamStatus.NOT_AVAILABLE], force=True)

    # ------------------------------------------------------------------ gather / release
    def _gather(self, params):
        gather_params(params)
        self.gathered_peak = max(self.gathered_peak, self._live_numel())

    def _release(self, params):
        release_params(params)

    def _live_numel(self):
        """Elements of non-persistent parameters gathered or in flight (each partitioner
        keeps the count, so this costs nothing per parameter)."""
        return sum(partitioner.live_numel for partitioner in self._partitioners)

    def _prefetch_after(self, module):
        """Forward reached ``module``: note its trace position and prefetch what follows."""
        start = _position_of(self.trace, module, self._position)
        if start is None:
            return
        self._position = start + 1
        self._started_at[id(module)] = start
        self._prefetch(self._forward_lookahead, start)

    def _prefetch(self, look, position):
        """Start gathering, one collective per module, the parameters of the modules that
        come after trace ``position`` in ``look``'s direction (up the trace in forward, down
        in backward): at most ``stage3_prefetch_bucket_size`` elements in flight ahead of the
        running module and ``stage3_max_live_parameters`` gathered in all. ``look`` keeps a
        cursor, so one pass looks at each module once."""
        if self.prefetch_bucket_size <= 0:
            return
        step, ahead = look.step, look.ahead
        while ahead and (ahead[0][0] - position) * step <= 0:  # reached: no longer ahead
            ahead.popleft()
        used = sum(size for _, size in ahead)
        live = self._live_numel()
        index = position + step
        if look.cursor is not None:
            index = max(index, look.cursor) if step > 0 else min(index, look.cursor)
        while 0 <= index < len(self.trace):
            todo = [p for p in self._params_of(self.trace[index])
                    if p.ds_status is ZeroParamStatus.NOT_AVAILABLE]
            size = sum(p.ds_numel for p in todo)
            if used + size > self.prefetch_bucket_size or live + size > self.max_live_parameters:
                break
            if todo and look.modules is not None and len(ahead) >= look.modules:
                break
            if todo:
                gather_params(todo, async_op=True)
                ahead.append((index, size))
            used += size
            live += size
            index += step
        look.cursor = index

    def _anything_to_prefetch(self):
        """Whether a module of the recorded trace needs gathering before it runs. When every
        parameter persists (a small model: the demo GPT) there is nothing to prefetch, and
        walking the trace at every module was ~1% of its step. Decided again when external
        parameters or leaf marks change what a module gathers (a stale answer costs speed
        only: a module's own pre-hook gathers whatever it finds partitioned)."""
        key = (_EXTERNAL_EDITS[0], leaf_mark_edits())
        if self._prefetch_key != key:
            self._prefetch_key = key
            self._prefetchable = any(self._params_of(m) and not self._all_persistent(m)
                                     for m in self.trace)
        return self._prefetchable

    def _params_of(self, module):
        """``module_params(module)``, cached until an external parameter is (un)registered or
        the module's leaf mark changes: the hooks ask for it several times per module and
        step."""
        return self._cached(module)[1]

    def _all_persistent(self, module):
        """Every parameter of ``module`` persists: once whole it stays whole until the step,
        so its hooks only gather it the first time (most modules of a small model)."""
        return self._cached(module)[2]

    def _cached(self, module):
        key = (_EXTERNAL_EDITS[0], z3_leaf_module(module))
        cached = self._params_cache.get(module)
        if cached is None or cached[0] != key:
            params = module_params(module)
            cached = self._params_cache[module] = (
                key, params, bool(params) and all(p.ds_persist for p in params))
        return cached


def load_full_state_dict(module, state_dict):
    """``module.load_state_dict`` for a ZeRO-3 model: weights saved whole (by stages 0-2, or
    ``save_16bit_model``) are cut into this rank's shards; ZeRO-3 placeholders (empty) are
    skipped, the optimizer's fp32 partitions restore those. Returns (missing, unexpected)."""
    own = module.state_dict(keep_vars=True)
    missing = [k for k in own if k not in state_dict]
    unexpected = [k for k in state_dict if k not in own]
    with torch.no_grad():
        for name, value in state_dict.items():
            target = own.get(name)
            if target is None:
                continue
            if not is_zero_param(target):
                target.copy_(value)
            elif value.numel() == target.ds_numel:
                target.ds_partitioner.load_full(target, value.to(target.dtype))
            elif value.numel() != 0:
                raise RuntimeError(f"size mismatch for {name}: the checkpoint holds "
                                   f"{tuple(value.shape)}, the model {tuple(target.ds_shape)}")
    return missing, unexpected


def gather_16bit_state_dict(module, exclude_frozen_parameters=False):
    """The full state dict, gathered one parameter at a time (bounded memory), on global rank
    0; None on the other ranks. Collective."""
    from deepspeed import comm as dist

    writer = dist.get_rank() == 0
    state = {}
    frozen = {n for n, p in module.named_parameters() if not p.requires_grad}
    for name, tensor in module.state_dict(keep_vars=True).items():
        if exclude_frozen_parameters and name in frozen:
            continue
        if is_zero_param(tensor):
            was_whole = tensor.ds_status is ZeroParamStatus.AVAILABLE
            tensor.ds_partitioner.gather([tensor])
            if writer:
                state[name] = tensor.detach().clone()
            if not was_whole:
                tensor.ds_partitioner.release([tensor])
        elif writer:
            state[name] = tensor.detach().clone()
    return state if writer else None


def save_16bit_state_dict(engine, save_dir, save_filename, exclude_frozen_parameters):
    """``gather_16bit_state_dict``, written atomically by global rank 0. Returns True."""
    import os

    from deepspeed.checkpoint import atomic_torch_save
    from deepspeed.checkpoint.collective import on_all_ranks

    state = gather_16bit_state_dict(engine.module, exclude_frozen_parameters)
    writer = state is not None
    path = os.path.join(os.fspath(save_dir), save_filename)

    def write():
        if writer:
            os.makedirs(os.fspath(save_dir), exist_ok=True)
            atomic_torch_save(state, path)

    on_all_ranks(engine, f"saving the 16-bit model to '{path}'", write)
    return True
