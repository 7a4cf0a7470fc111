"""`checkpoint(function, *args)`: run a segment without keeping its activations, and run it
again in backward to get them back.

The recompute must reproduce the forward bit for bit, so it replays the RNG states (CPU,
accelerator and the model-parallel tracker streams) and the autocast state captured before the
forward. What is kept of the inputs in between is storage.py's business.
"""
import contextlib
import time
from typing import Any, List, Optional, Tuple

import torch

from deepspeed.accelerator import get_accelerator
from deepspeed.activation_checkpointing import settings as _settings
from deepspeed.activation_checkpointing.rng import RNGSnapshot, replayed_rng
from deepspeed.activation_checkpointing.storage import restore_inputs, stash_inputs
from deepspeed.utils.logging import log_dist

GRAD_API_MESSAGE = ("Checkpointing is not compatible with .grad() or when an `inputs` parameter is "
                    "passed to .backward(); use .backward() without `inputs` instead")


@contextlib.contextmanager
def _boundary(settings: _settings.CheckpointingSettings, phase: str):
    """synchronize_checkpoint_boundary and profile around one forward or backward."""
    accelerator = get_accelerator()
    if settings.synchronize:
        accelerator.synchronize()
    start = time.perf_counter() if settings.profile else None
    yield
    if settings.synchronize:
        accelerator.synchronize()
    if start is not None:
        if not settings.synchronize:
            accelerator.synchronize()  # else the time is only the kernel launches
        elapsed_ms = (time.perf_counter() - start) * 1000.0
        log_dist(f"activation checkpoint {phase}: {elapsed_ms:.3f} ms", ranks=[0])


# -- autocast -------------------------------------------------------------------------------------
def _autocast_device_types() -> List[str]:
    types = ["cpu"]
    accelerator_type = torch.device(get_accelerator().device_name()).type
    if accelerator_type not in types and torch.amp.is_autocast_available(accelerator_type):
        types.append(accelerator_type)
    return types


def _autocast_state() -> Tuple[List[Tuple[str, torch.dtype]], bool]:
    enabled = [(device_type, torch.get_autocast_dtype(device_type))
               for device_type in _autocast_device_types()
               if torch.is_autocast_enabled(device_type)]
    return enabled, torch.is_autocast_cache_enabled()


@contextlib.contextmanager
def _autocast(state: Tuple[List[Tuple[str, torch.dtype]], bool]):
    """Re-enter the forward's autocast regions: backward runs outside them, and a recompute in
    another dtype would not match the saved graph."""
    enabled, cache_enabled = state
    with contextlib.ExitStack() as stack:
        for device_type, dtype in enabled:
            stack.enter_context(torch.autocast(device_type, dtype=dtype,
                                               cache_enabled=cache_enabled))
        yield


# -- outputs --------------------------------------------------------------------------------------
def _holds_tensor(value: Any) -> bool:
    if torch.is_tensor(value):
        return True
    if isinstance(value, (list, tuple)):
        return any(_holds_tensor(v) for v in value)
    if isinstance(value, dict):
        return any(_holds_tensor(v) for v in value.values())
    return False


def _as_outputs(outputs: Any) -> Any:
    """A tensor, or a flat tuple: autograd tracks only tensors at the top level of the tuple
    (a returned list would silently lose its graph)."""
    if torch.is_tensor(outputs):
        return outputs
    if isinstance(outputs, (list, tuple)):
        nested = [i for i, item in enumerate(outputs)
                  if not torch.is_tensor(item) and _holds_tensor(item)]
        if nested:
            raise TypeError(f"checkpoint(): output {nested[0]} of the function nests tensors "
                            f"inside a {type(outputs[nested[0]]).__name__}; return the tensors at "
                            f"the top level of a tuple so gradients can flow through them")
        return tuple(outputs)
    if _holds_tensor(outputs):
        raise TypeError(f"checkpoint(): the function returned a {type(outputs).__name__} holding "
                        f"tensors; return a tensor or a tuple of tensors (and other values)")
    return outputs


class CheckpointFunction(torch.autograd.Function):
    """Forward without saving activations; in backward, rebuild the inputs (gathering
    partitions), replay the RNG and autocast state, recompute, and backpropagate through it.

    `apply(run_function, grad_anchor, *args)`: `grad_anchor` is None or an empty tensor requiring
    grad, passed when no input requires grad so the outputs still do and the segment's
    parameters get their gradients (`torch.utils.checkpoint`'s reentrant mode silently gives
    them none). `checkpoint()` supplies it.
    """

    @staticmethod
    def forward(ctx, run_function, grad_anchor, *args):
        settings = _settings.current()
        ctx.run_function = run_function
        ctx.settings = settings
        ctx.set_materialize_grads(False)
        with _boundary(settings, "forward"):
            ctx.rng = RNGSnapshot.capture()
            ctx.autocast = _autocast_state()
            with torch.no_grad():
                outputs = _as_outputs(run_function(*args))
            saved, ctx.plan = stash_inputs(args, settings, _settings.contiguous_buffers())
            ctx.save_for_backward(*saved)
        flat = outputs if isinstance(outputs, tuple) else (outputs,)
        non_differentiable = [o for o in flat if torch.is_tensor(o) and not o.is_floating_point()
                              and not o.is_complex()]
        if non_differentiable:
            ctx.mark_non_differentiable(*non_differentiable)
        return outputs

    @staticmethod
    def backward(ctx, *grads):
        if not torch.autograd._is_checkpoint_valid():
            raise RuntimeError(GRAD_API_MESSAGE)
        settings = ctx.settings
        buffers = _settings.contiguous_buffers()
        if buffers.enabled:
            # the saved slot views keep their memory; the next forward gets fresh buffers
            buffers.release()
        with _boundary(settings, "backward"):
            inputs = restore_inputs(ctx.saved_tensors, ctx.plan, settings)
            with replayed_rng(ctx.rng), torch.enable_grad(), _autocast(ctx.autocast):
                outputs = _as_outputs(ctx.run_function(*inputs))
            flat = outputs if isinstance(outputs, tuple) else (outputs,)
            pairs = [(out, grad) for out, grad in zip(flat, grads)
                     if grad is not None and torch.is_tensor(out) and out.requires_grad]
            if pairs:
                torch.autograd.backward([out for out, _ in pairs], [grad for _, grad in pairs])
        input_grads = tuple(inp.grad if torch.is_tensor(inp) and inp.requires_grad else None
                            for inp in inputs)
        return (None, None) + input_grads


def _grad_anchor(args) -> Optional[torch.Tensor]:
    if any(torch.is_tensor(arg) and arg.requires_grad for arg in args):
        return None
    return torch.empty(0, requires_grad=True)


def checkpoint(function, *args):
    """Checkpoint a model segment: a drop-in for `torch.utils.checkpoint.checkpoint`.

    Returns what `function` returns (a list comes back as a tuple). Tensor and non-tensor
    arguments are both fine; tensors nested inside containers are passed through but get no
    gradient. With grad disabled nothing needs recomputing, so the function just runs.
    """
    if not callable(function):
        raise TypeError(f"checkpoint() expects a callable as its first argument, got "
                        f"{type(function).__name__}")
    if not torch.is_grad_enabled():
        with _boundary(_settings.current(), "forward"):
            return _as_outputs(function(*args))
    return CheckpointFunction.apply(function, _grad_anchor(args), *args)
