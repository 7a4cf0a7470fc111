"""The base class of DeepSpeed's own optimizers: ``torch.optim.Optimizer`` without importing
``torch._dynamo`` in a run that compiles nothing.

torch decorates ``Optimizer.add_param_group``, ``zero_grad``, ``state_dict`` and
``load_state_dict`` with ``torch._disable_dynamo``, whose first call imports ``torch._dynamo`` so
that a compiled caller graph-breaks there. Constructing any optimizer therefore imports dynamo
and, through it, sympy, mpmath, torch.onnx and torch._inductor: about 1,000 modules and +72 MiB
of resident memory per process on torch 2.13 (measured on this project's CPU machine), in every
rank, for nothing when no ``torch.compile`` runs. Our optimizers call torch's undecorated method
while dynamo is not imported (it cannot be tracing the call then) and the decorated one as soon as
it is, so under ``torch.compile`` nothing changes.
"""
import functools
import sys

import torch


# the code object of ``torch._disable_dynamo``'s wrapper: only that decorator is skipped, never
# another one a torch version might put on the same methods
_disable_dynamo = getattr(torch, "_disable_dynamo", None)
_DISABLE_DYNAMO_CODE = _disable_dynamo(lambda: None).__code__ if _disable_dynamo else None


def _torch_method(name):
    decorated = getattr(torch.optim.Optimizer, name)
    code = getattr(decorated, "__code__", None)
    undecorated = decorated
    if _DISABLE_DYNAMO_CODE is not None and code is _DISABLE_DYNAMO_CODE:
        undecorated = decorated.__wrapped__

    @functools.wraps(undecorated)
    def method(self, *args, **kwargs):
        chosen = decorated if "torch._dynamo" in sys.modules else undecorated
        return chosen(self, *args, **kwargs)

    return method


class DeepSpeedOptimizer(torch.optim.Optimizer):
    """``torch.optim.Optimizer``, minus the dynamo import (see the module docstring)."""

    add_param_group = _torch_method("add_param_group")
    zero_grad = _torch_method("zero_grad")
    state_dict = _torch_method("state_dict")
    load_state_dict = _torch_method("load_state_dict")
