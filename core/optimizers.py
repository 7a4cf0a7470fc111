"""The basic optimizer an engine steps: the client's, or the one the config's ``optimizer`` names.

``optimizer.type`` is compared case-insensitively, as DeepSpeed does:

- ``adam`` / ``adamw``: DeepSpeedCPUAdam where the optimizer runs on the host (ZeRO-Offload, or a
  CPU-only run), FusedAdam otherwise; ``torch_adam: true`` picks ``torch.optim.Adam``/``AdamW``.
  ``adam_w_mode`` defaults to True, so ``Adam`` decays weights decoupled (AdamW) unless it is set
  false; ``adamw`` is always decoupled.
- ``lamb``: FusedLamb. ``lion``: DeepSpeedCPULion on the host, FusedLion otherwise.
  ``adagrad``: DeepSpeedCPUAdagrad on the host, ``torch.optim.Adagrad`` otherwise.
- ``muadam`` / ``muadamw`` / ``musgd``: the ``mup`` package's optimizers.
- any name a plugin claims (the 1-bit optimizers, ...): built by that plugin through the
  ``deepspeed_build_optimizer`` hook; the core keeps no table of them.
- any other name: the ``torch.optim`` class of that name (``SGD``, ``RMSprop``, ...).

Plugins wrap the result (ZeRO, 1-bit) through ``deepspeed_wrap_optimizer``.
"""
from typing import Dict, Optional

import torch

from deepspeed.config import DeepSpeedConfigError
from deepspeed.config.call_params import check_call_params
from deepspeed.config.errors import closest_key
from deepspeed.utils.logging import logger

ADAGRAD_OPTIMIZER = "adagrad"
ADAM_OPTIMIZER = "adam"
ADAMW_OPTIMIZER = "adamw"
LAMB_OPTIMIZER = "lamb"
LION_OPTIMIZER = "lion"
MUADAM_OPTIMIZER = "muadam"
MUADAMW_OPTIMIZER = "muadamw"
MUSGD_OPTIMIZER = "musgd"
DEEPSPEED_OPTIMIZERS = [
    ADAGRAD_OPTIMIZER, ADAM_OPTIMIZER, ADAMW_OPTIMIZER, LAMB_OPTIMIZER, LION_OPTIMIZER,
    MUADAM_OPTIMIZER, MUADAMW_OPTIMIZER, MUSGD_OPTIMIZER,
]
TORCH_ADAM_PARAM = "torch_adam"
ADAM_W_MODE = "adam_w_mode"


def build_optimizer(client_optimizer, config, model_parameters, plugin_builder=None,
                    device=None):
    """Return the optimizer to step, or None for an engine without one (inference).

    ``plugin_builder(name=, params=, optimizer_params=)`` asks the enabled plugins for a
    type the core does not build itself (the ``deepspeed_build_optimizer`` hook). ``device``
    is where a plugin keeps the fp32 masters the optimizer will step (``"cpu"`` under
    ZeRO-Offload, the ``deepspeed_optimizer_device`` hook); None means the parameters'."""
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
    options = _checked_options(config.optimizer_params)
    model_parameters = [dict(entry, params=_as_list(entry["params"])) if isinstance(entry, dict)
                        else entry for entry in model_parameters]
    key = CONFIG_ALIASES.get(name.lower(), name.lower())
    factory = _FACTORIES.get(key)
    if factory is not None:
        return factory(model_parameters, options, _runs_on_host(device, model_parameters), key)
    built = plugin_builder(name=name, params=model_parameters, optimizer_params=options) \
        if plugin_builder is not None else None
    if built is not None:
        return built
    torch_class = _torch_optimizers().get(key)
    if torch_class is not None:
        return construct(torch_class, model_parameters, options)
    known = sorted(set(DEEPSPEED_OPTIMIZERS) | set(_torch_optimizers()))
    guess = closest_key(key, known)
    hint = f"; did you mean '{guess}'?" if guess else ""
    raise DeepSpeedConfigError(
        f"optimizer.type: '{name}' is not a DeepSpeed optimizer "
        f"({', '.join(DEEPSPEED_OPTIMIZERS)}), a torch.optim class, nor built by an enabled "
        f"plugin{hint}")


def construct(cls, model_parameters, options: Dict):
    """``cls(model_parameters, **options)``, with every option first checked against the
    constructor's signature: an unknown key (with the closest valid one) or a value of the
    wrong kind (``lr: "1e-3x"``) is reported with its config key path, all at once, instead of
    a TypeError from deep inside the constructor."""
    problems = check_call_params(cls, options, ("optimizer", "params"), owner=cls.__name__)
    if problems:
        raise DeepSpeedConfigError(problems)
    return cls(model_parameters, **options)


# ------------------------------------------------------------------------------ helpers
def _checked_options(params: Optional[Dict]) -> Dict:
    options = dict(params or {})
    if "max_grad_norm" in options:
        raise DeepSpeedConfigError("optimizer.params.max_grad_norm is not supported; use the "
                                   "top-level 'gradient_clipping' key instead")
    return options


def _runs_on_host(device, model_parameters) -> bool:
    """True when the optimizer steps on the CPU: a plugin keeps the masters there (``device``),
    or the params live there (a CPU-only run, where the DeepSpeed CPU optimizers are the fast
    path)."""
    if device is not None and torch.device(device).type == "cpu":
        return True
    tensors = [t for entry in model_parameters
               for t in (entry["params"] if isinstance(entry, dict) else [entry])]
    return bool(tensors) and all(t.device.type == "cpu" for t in tensors)


def _as_list(params):
    return [params] if torch.is_tensor(params) else list(params)


def _torch_optimizers() -> Dict[str, type]:
    return {name.lower(): obj for name, obj in vars(torch.optim).items()
            if isinstance(obj, type) and issubclass(obj, torch.optim.Optimizer)
            and obj is not torch.optim.Optimizer}


def _adam(params, options, on_host, key):
    torch_adam = options.pop(TORCH_ADAM_PARAM, False)
    adam_w_mode = options.pop(ADAM_W_MODE, True)
    if key == ADAMW_OPTIMIZER and not adam_w_mode:
        logger.warning("optimizer.params.adam_w_mode=false is ignored for type AdamW; "
                       "use type Adam for L2-regularised Adam")
    decoupled = key == ADAMW_OPTIMIZER or adam_w_mode
    if torch_adam:
        if not options.pop("bias_correction", True):
            raise DeepSpeedConfigError("optimizer.params.bias_correction=false needs DeepSpeed's "
                                       "Adam; torch.optim.Adam(W) always corrects the bias "
                                       "(remove torch_adam)")
        return construct(torch.optim.AdamW if decoupled else torch.optim.Adam, params, options)
    if on_host:
        from deepspeed.ops.adam import DeepSpeedCPUAdam

        return construct(DeepSpeedCPUAdam, params, dict(options, adamw_mode=decoupled))
    from deepspeed.ops.adam import FusedAdam

    return construct(FusedAdam, params, dict(options, adam_w_mode=decoupled))


def _lamb(params, options, on_host, key):
    from deepspeed.ops.lamb import FusedLamb

    return construct(FusedLamb, params, options)


def _lion(params, options, on_host, key):
    from deepspeed.ops.lion import DeepSpeedCPULion, FusedLion

    return construct(DeepSpeedCPULion if on_host else FusedLion, params, options)


def _adagrad(params, options, on_host, key):
    from deepspeed.ops.adagrad import DeepSpeedCPUAdagrad

    return construct(DeepSpeedCPUAdagrad if on_host else torch.optim.Adagrad, params, options)


def _mup(params, options, on_host, key):
    try:
        import mup
    except ImportError:
        raise DeepSpeedConfigError(f"optimizer.type '{key}' needs the 'mup' package "
                                   f"(pip install mup)") from None
    cls = {MUADAM_OPTIMIZER: "MuAdam", MUADAMW_OPTIMIZER: "MuAdamW", MUSGD_OPTIMIZER: "MuSGD"}[key]
    return construct(getattr(mup, cls), params, options)


def _cpu_adam(params, options, on_host, key):
    return _adam(params, options, True, ADAM_OPTIMIZER)


def _fused_adam(params, options, on_host, key):
    return _adam(params, options, False, ADAM_OPTIMIZER)


# DeepSpeed's class names written as config types ("type": "FusedAdam" / "CPUAdam")
CONFIG_ALIASES = {"fusedlamb": LAMB_OPTIMIZER,
                  "fusedlion": LION_OPTIMIZER, "cpuadam": "cpuadam",
                  "deepspeedcpuadam": "cpuadam"}

_FACTORIES = {
    "cpuadam": _cpu_adam,
    "fusedadam": _fused_adam,
    ADAM_OPTIMIZER: _adam,
    ADAMW_OPTIMIZER: _adam,
    LAMB_OPTIMIZER: _lamb,
    LION_OPTIMIZER: _lion,
    ADAGRAD_OPTIMIZER: _adagrad,
    MUADAM_OPTIMIZER: _mup,
    MUADAMW_OPTIMIZER: _mup,
    MUSGD_OPTIMIZER: _mup,
}
