"""Turning random-LTD on for a model and off for its checkpoints (upstream:
``deepspeed.runtime.data_pipeline.data_routing.helper``)."""
from collections import OrderedDict

from torch import nn

from .basic_layer import RandomLayerTokenDrop

WRAPPED = ".random_ltd_layer"


def convert_to_random_ltd(model, convert_type):
    """Wrap every submodule of class ``convert_type`` in ``RandomLayerTokenDrop``. ``model`` is
    the engine (``deepspeed.initialize``'s, as documented: then the wrappers are configured
    from the ``random_ltd`` section now) or a plain module (configure with ``init_config``)."""
    module = model.module if hasattr(model, "random_ltd_initialize") else model
    if not isinstance(module, nn.Module):
        raise TypeError(f"convert_to_random_ltd needs a module or engine, got "
                        f"{type(model).__name__}")
    found = _wrap(module, convert_type)
    if not found:
        raise ValueError(f"convert_to_random_ltd: the model holds no {convert_type.__name__} "
                         f"module to wrap")
    if hasattr(model, "random_ltd_initialize"):
        model.random_ltd_initialize()
    return model


def _wrap(module, convert_type):
    count = 0
    for name, child in module.named_children():
        if isinstance(child, RandomLayerTokenDrop):
            continue
        if isinstance(child, convert_type):
            setattr(module, name, RandomLayerTokenDrop(child))
            count += 1
        else:
            count += _wrap(child, convert_type)
    return count


def remove_random_ltd_state_dict(state_dict):
    """The same weights under the unwrapped model's keys."""
    return OrderedDict((key.replace(WRAPPED, ""), value) for key, value in state_dict.items())


def random_ltd_layers(module):
    return [m for m in module.modules() if isinstance(m, RandomLayerTokenDrop)]
