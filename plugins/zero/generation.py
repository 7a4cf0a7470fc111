"""``unwrap_model_for_generation``: generate with a ZeRO-3 model at the speed of a whole one.

Under ZeRO-3 every module's forward gathers its parameters and releases them afterwards, so an
autoregressive ``generate`` of N tokens all-gathers the whole model N times. Inside this context
the parameters are gathered once and the gather/release hooks are detached, so generation runs
on plain whole weights; on exit the hooks come back and the parameters are partitioned again.
The context is collective (every rank of the parameters' group enters it) and the weights must
not be changed inside it (they are released, not written back). Without ZeRO-3 it only yields
the module.
"""
from contextlib import contextmanager

from deepspeed.zero.gathered_parameters import GatheredParameters
from deepspeed.zero.partition_parameters import is_zero_param


def _module_of(model):
    """The client module of an engine, else ``model`` itself."""
    from deepspeed.engine import DeepSpeedEngine

    return model.module if isinstance(model, DeepSpeedEngine) else model


@contextmanager
def unwrap_model_for_generation(model, gather_deepspeed3_params=True):
    """Yield the module of ``model`` (an engine or a module) with its ZeRO-3 parameters whole
    and its ZeRO-3 hooks detached (see the module docstring). ``gather_deepspeed3_params=False``
    yields it unchanged (each module gathers as usual: slower, less memory)."""
    module = _module_of(model)
    params = [p for p in module.parameters() if is_zero_param(p)]
    if not params or not gather_deepspeed3_params:
        yield module
        return
    coordinators = []
    for param in params:
        coordinator = getattr(param, "ds_coordinator", None)
        if coordinator is not None and all(c is not coordinator for c in coordinators):
            coordinators.append(coordinator)
    with GatheredParameters(params):
        for coordinator in coordinators:
            coordinator.remove()
        try:
            yield module
        finally:
            for coordinator in coordinators:
                coordinator.install()


__all__ = ["unwrap_model_for_generation"]
