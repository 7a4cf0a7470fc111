"""Inference's one change to torch, and why: while ``empty_init()`` is open,

- ``torch.nn.Module.register_parameter`` moves each parameter a module registers to the meta
  device (``requires_grad`` kept), so a model is built without storage for its weights: the
  checkpoint loader (``deepspeed.inference.checkpoint``) materialises each one at this rank's
  shard size as its tensor arrives, and no rank ever holds the whole model. Buffers stay real
  (rotary tables and masks are computed at construction and are not in checkpoints).

It is a ``deepspeed.utils.patching.PatchSet``: leaving the context, also by an exception, puts
the exact previous ``register_parameter`` back; nested ``empty_init`` contexts, and other
patches of the same method (``zero.Init`` does not patch it, but a library might), compose.
"""
import contextlib

from torch import nn

from deepspeed.utils.patching import PatchSet


def _parameters_on_meta(patches):
    register = nn.Module.register_parameter

    def on_meta(module, name, param):
        if param is not None and param.device.type != "meta":
            param = nn.Parameter(param.to("meta"), requires_grad=param.requires_grad)
        register(module, name, param)

    patches.replace(nn.Module, "register_parameter", on_meta)


@contextlib.contextmanager
def empty_init():
    """Build modules with their parameters on the meta device (no storage) and their buffers
    real (rotary tables and masks are computed at construction and are not in checkpoints)."""
    with PatchSet("inference.empty_init: nn.Module.register_parameter", _parameters_on_meta):
        yield
