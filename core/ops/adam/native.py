"""Choosing and driving the native CPU optimizer kernels (csrc/cpu/, built by the op builders
``CPUAdamBuilder`` / ``CPUAdagradBuilder`` / ``CPULionBuilder``).

The kernels take raw data pointers, so everything that makes a pointer safe is checked here:
a bucket goes native only when its params, gradients and states are fp32 and its params and
states are contiguous (they are updated in place); a non-contiguous gradient is read from a
contiguous copy. Anything else (half params, strided params) takes the PyTorch path, which does
the same math. The kernel is used when it loads; the PyTorch path otherwise, with one log line
per op saying which. ``DS_CPU_OPTIMIZER_FALLBACK=1`` or ``use_native=False`` forces the PyTorch
path (tests compare the two); ``use_native=True`` makes a failed build an error.
"""
import logging
import os
import threading
from typing import Dict, Optional

import torch

from deepspeed.ops.adam.multi_tensor_apply import Bucket, fp16_targets
from deepspeed.utils.logging import log_per_node

FORCE_FALLBACK_ENV = "DS_CPU_OPTIMIZER_FALLBACK"

# half_kind codes of the kernels' fused low-precision param copy (csrc/cpu/optim_common.h)
HALF_KIND = {torch.bfloat16: 1, torch.float16: 2}

_lock = threading.Lock()
_modules: Dict[str, object] = {}  # op name -> loaded module, or None when it failed to load
_logged = set()


def _log_once(key, message, level=logging.INFO):
    """Once per process, and from local rank 0 only: every rank of a node loads the same op."""
    if key not in _logged:
        _logged.add(key)
        log_per_node(message, level)


def load_kernel(builder_class, optimizer_name: str, use_native: Optional[bool]):
    """The loaded op module, or None for the PyTorch path.

    ``use_native``: None = native when it builds, False = never, True = native or raise."""
    if use_native not in (None, True, False):
        raise ValueError(f"{optimizer_name}: use_native must be None, True or False, "
                         f"got {use_native!r}")
    forced = os.environ.get(FORCE_FALLBACK_ENV, "0").strip()
    if forced not in ("", "0", "1"):
        raise ValueError(f"{FORCE_FALLBACK_ENV}={forced!r}: expected 0 or 1")
    if use_native is False or (forced == "1" and use_native is None):
        why = "use_native=False" if use_native is False else f"{FORCE_FALLBACK_ENV}=1"
        _log_once((optimizer_name, "forced"), f"{optimizer_name}: PyTorch path ({why})")
        return None
    name = builder_class.NAME
    with _lock:
        if name not in _modules:
            from deepspeed.ops.op_builder.builder import OpBuildError

            try:
                _modules[name] = builder_class().load(verbose=False)
            except OpBuildError as err:
                _modules[name] = None
                _modules[name + ":error"] = str(err)
        module = _modules[name]
    if module is None:
        error = _modules[name + ":error"]
        if use_native:
            raise RuntimeError(f"{optimizer_name}(use_native=True): native op '{name}' did not "
                               f"load: {error}")
        _log_once((optimizer_name, "fallback"), f"{optimizer_name}: native op '{name}' "
                  f"unavailable, using the PyTorch path: {error}", level=logging.WARNING)
        return None
    _log_once((optimizer_name, "native"),
              f"{optimizer_name}: native op '{name}' ({module.simd_level()})")
    return module


def native_ready(bucket: Bucket) -> bool:
    """Whether the kernels may update this bucket through raw pointers (see the module doc)."""
    if any(g.dtype != torch.float32 for g in bucket.grads):
        return False
    for tensor in (*bucket.params, *(t for ts in bucket.states.values() for t in ts)):
        if tensor.dtype != torch.float32 or not tensor.is_contiguous():
            return False
    return True


def contiguous_grad(grad: torch.Tensor) -> torch.Tensor:
    return grad if grad.is_contiguous() else grad.contiguous()


def run_native(kernel, bucket: Bucket, state_names, targets, **hyper):
    """``kernel(param, grad, *states, half_out, half_kind, numel, **hyper)`` on raw pointers for
    every tensor of ``bucket``: the calling convention the three CPU optimizer kernels share."""
    for i, param in enumerate(bucket.params):
        grad = contiguous_grad(bucket.grads[i])
        states = [bucket.states[name][i].data_ptr() for name in state_names]
        half_ptr, half_kind = targets.claim(param)
        kernel(param.data_ptr(), grad.data_ptr(), *states, half_ptr, half_kind, param.numel(),
               **hyper)


class HalfTargets:
    """The ``step(fp16_param_groups=...)`` copies: those the kernel can write in its own pass
    (host, contiguous, bf16/fp16, same numel as an fp32 param) are handed out by ``claim``;
    ``finish`` copies the rest (device tensors, other layouts, params the PyTorch path stepped)
    the ordinary way."""

    def __init__(self, optimizer, fp16_param_groups):
        self._pairs = []
        self._fusable = {}
        self._written = set()
        for param, target in fp16_targets(optimizer.param_groups, fp16_param_groups):
            if param.grad is None:
                continue
            self._pairs.append((param, target))
            if (target.device.type == "cpu" and target.dtype in HALF_KIND
                    and target.is_contiguous() and target.numel() == param.numel()):
                self._fusable[id(param)] = target

    def claim(self, param):
        """(pointer, half_kind) for the kernel; (0, 0) when this param has no fusable copy."""
        target = self._fusable.get(id(param))
        if target is None or param.dtype != torch.float32:
            return 0, 0
        self._written.add(id(param))
        return target.data_ptr(), HALF_KIND[target.dtype]

    def finish(self):
        with torch.no_grad():
            for param, target in self._pairs:
                if id(param) not in self._written:
                    target.copy_(param.view_as(target), non_blocking=True)
