"""The basic optimizer an engine steps: the client's, or one named in the config.

Config names are matched case-insensitively, as DeepSpeed does. This module maps the names with
an exact PyTorch equivalent; DeepSpeed's own optimizers (Lamb, Lion, CPU/fused kernels, 1-bit)
are added by the training-engine and native-ops work, plugins wrap the result through
``deepspeed_wrap_optimizer``.
"""
import torch

from deepspeed.config import DeepSpeedConfigError


def _adam(params, p):
    p = dict(p)
    adam_w_mode = p.pop("adam_w_mode", True)
    p.pop("torch_adam", None)
    p.pop("bias_correction", None)
    cls = torch.optim.AdamW if adam_w_mode else torch.optim.Adam
    return cls(params, **p)


def _adamw(params, p):
    p = dict(p)
    p.pop("torch_adam", None)
    p.pop("adam_w_mode", None)
    p.pop("bias_correction", None)
    return torch.optim.AdamW(params, **p)


def _plain(cls):
    return lambda params, p: cls(params, **p)


OPTIMIZER_FACTORIES = {
    "adam": _adam,
    "adamw": _adamw,
    "sgd": _plain(torch.optim.SGD),
    "adagrad": _plain(torch.optim.Adagrad),
}


def build_optimizer(client_optimizer, config, model_parameters, plugin_builder=None):
    """Return the optimizer to step, or None for an engine without one (inference).

    ``plugin_builder(name=, params=, optimizer_params=)`` asks the enabled plugins for a
    type the core does not know (the ``deepspeed_build_optimizer`` hook)."""
    name = config.optimizer_name
    if client_optimizer is not None:
        if name is not None:
            raise DeepSpeedConfigError(
                f"an optimizer was passed to deepspeed.initialize and the config also has an "
                f"'optimizer' section (type '{name}'); keep only one of them")
        if isinstance(client_optimizer, torch.optim.Optimizer):
            return client_optimizer
        if callable(client_optimizer):
            return client_optimizer(model_parameters)
        raise TypeError(f"{type(client_optimizer).__name__} is not a subclass of "
                        f"torch.optim.Optimizer nor a callable returning one")
    if name is None:
        return None
    params = dict(config.optimizer_params or {})
    if "max_grad_norm" in params:
        raise DeepSpeedConfigError("optimizer.params.max_grad_norm is not supported; use the "
                                   "top-level 'gradient_clipping' key instead")
    factory = OPTIMIZER_FACTORIES.get(name.lower())
    if factory is not None:
        return factory(model_parameters, params)
    built = plugin_builder(name=name, params=model_parameters, optimizer_params=params) \
        if plugin_builder is not None else None
    if built is None:
        raise DeepSpeedConfigError(
            f"optimizer.type: '{name}' is not available; the core provides "
            f"{sorted(OPTIMIZER_FACTORIES)} and no enabled plugin builds '{name}'")
    return built
