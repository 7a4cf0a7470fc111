"""The pieces of a pipeline model that are not the module itself: layer specifications
(`LayerSpec`, `TiedLayerSpec`) and the stage partitioning of a layer list.

A layer entry of a `PipelineModule` is an `nn.Module`, a `LayerSpec` (built lazily, only on the
stage that owns it), a `TiedLayerSpec` (built on every stage that uses its key, the tied weights
kept in sync) or any other callable (a lambda, `torch.flatten`, ...).

`partition_layers(layers, num_stages, method)` answers the stage boundaries without any process
group, so the partitioning can be checked on plain layer lists.
"""
import random
import re
from typing import Callable, List, Optional, Sequence

import torch
from torch import nn

from deepspeed.utils.arg_checks import check_names
from deepspeed.utils.logging import logger
from deepspeed.pipe.partitioning import partition_balanced, partition_uniform

PARTITION_METHODS = ("parameters", "uniform", "type:<regex>")


def _describe(obj) -> str:
    return getattr(obj, "__qualname__", None) or getattr(obj, "__name__", None) or repr(obj)


def _call_repr(name, args, kwargs) -> str:
    pieces = [repr(a) for a in args] + [f"{k}={v!r}" for k, v in kwargs.items()]
    return f"{name}({', '.join(pieces)})"


class LayerSpec:
    """What to build for one layer: ``typename(*module_args, **module_kwargs)``, deferred so that
    each rank builds only the layers of its own pipeline stage.

    >>> LayerSpec(nn.Linear, 4, 8, bias=False).build()
    Linear(in_features=4, out_features=8, bias=False)
    """

    def __init__(self, typename, *module_args, **module_kwargs):
        if not (isinstance(typename, type) and issubclass(typename, nn.Module)):
            raise RuntimeError(f"LayerSpec only supports torch.nn.Module types, got "
                               f"{_describe(typename)!s} ({type(typename).__name__}); pass other "
                               f"callables (lambdas, functions) to PipelineModule directly")
        self.typename = typename
        self.module_args = module_args
        self.module_kwargs = module_kwargs

    def __repr__(self):
        return _call_repr(self.typename.__name__, self.module_args, self.module_kwargs)

    def build(self, log=False):
        """Instantiate the layer."""
        if log:
            logger.info(f"building {self!r}")
        return self.typename(*self.module_args, **self.module_kwargs)


class TiedLayerSpec(LayerSpec):
    """A layer whose weights (the attributes named in ``tied_weight_attr``, dotted paths allowed)
    are shared by every layer with the same ``key``, across stages too. On a stage the key's module
    is built once; ``forward_fn(module, x)``, when given, replaces ``module(x)`` (e.g. an output
    projection that reuses an embedding's weight)."""

    def __init__(self, key, typename, *module_args, forward_fn: Optional[Callable] = None,
                 tied_weight_attr=("weight",), **module_kwargs):
        super().__init__(typename, *module_args, **module_kwargs)
        if forward_fn is not None and not callable(forward_fn):
            raise TypeError(f"TiedLayerSpec(key={key!r}): forward_fn must be callable, got "
                            f"{type(forward_fn).__name__}")
        tied_weight_attr = check_names(f"TiedLayerSpec(key={key!r}): tied_weight_attr",
                                       tied_weight_attr, error=TypeError)
        self.key = key
        self.forward_fn = forward_fn
        self.tied_weight_attr = tied_weight_attr

    def __repr__(self):
        return f"TiedLayerSpec(key={self.key!r}, {super().__repr__()})"


def get_nested_attr(module, path: str):
    """``module.a.b`` for ``path='a.b'``."""
    obj = module
    for part in path.split("."):
        obj = getattr(obj, part)
    return obj


def set_random_seed(seed: int) -> None:
    """Seed Python's, NumPy's (when installed) and torch's generators."""
    random.seed(seed)
    try:
        import numpy
    except ImportError:  # pragma: no cover - numpy is optional
        pass
    else:
        numpy.random.seed(seed % (2**32))
    torch.manual_seed(seed)


# ------------------------------------------------------------------------------- partitioning
def layer_type_name(layer) -> Optional[str]:
    """The class name a 'type:<regex>' partition matches: the spec's type, the module's class, or
    a callable's ``__name__`` (None when it has none)."""
    if isinstance(layer, LayerSpec):
        return layer.typename.__name__
    if isinstance(layer, nn.Module):
        return type(layer).__name__
    return getattr(layer, "__name__", None)


def _trainable_numel(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters() if p.requires_grad)


def _spec_numel(spec: LayerSpec) -> int:
    """Parameters of a spec's layer without allocating them: built on the meta device (a layer
    that cannot be built there is built for real and dropped)."""
    try:
        with torch.device("meta"):
            module = spec.build()
    except Exception as exc:  # noqa: BLE001 - any failure only means "not meta-buildable"
        logger.debug(f"counting the parameters of {spec!r} on the meta device failed ({exc}); "
                     f"building it on the CPU instead")
        module = spec.build()
    return _trainable_numel(module)


def count_layer_params(layers: Sequence) -> List[int]:
    """The trainable parameter count of each layer entry (0 for plain callables)."""
    counts, cache = [], {}
    for layer in layers:
        if isinstance(layer, LayerSpec):
            if id(layer) not in cache:
                cache[id(layer)] = _spec_numel(layer)
            counts.append(cache[id(layer)])
        elif isinstance(layer, nn.Module):
            counts.append(_trainable_numel(layer))
        else:
            counts.append(0)
    return counts


def find_layer_type(layers: Sequence, pattern: str) -> List[int]:
    """Indices of the layers whose type name matches ``pattern`` (case-insensitive search)."""
    regex = re.compile(pattern, re.IGNORECASE)
    return [idx for idx, layer in enumerate(layers)
            if (name := layer_type_name(layer)) is not None and regex.search(name)]


def partition_layers(layers: Sequence, num_stages: int, method: str = "parameters") -> List[int]:
    """Stage boundaries ``parts`` (length ``num_stages + 1``): stage ``s`` owns the layers
    ``parts[s]:parts[s + 1]``.

    - ``'parameters'``: balance the trainable parameter counts;
    - ``'uniform'``: balance the number of layers;
    - ``'type:<regex>'``: balance the number of layers whose class name matches the regex
      (case-insensitive); no match is a RuntimeError.
    """
    if not isinstance(method, str):
        raise NotImplementedError(f"Partitioning method {method!r} not implemented; use one of "
                                  f"{', '.join(PARTITION_METHODS)}")
    num_layers = len(layers)
    lowered = method.lower()
    if lowered == "uniform":
        return partition_uniform(num_items=num_layers, num_parts=num_stages)
    if lowered == "parameters":
        return partition_balanced(weights=count_layer_params(layers), num_parts=num_stages)
    if lowered.startswith("type:"):
        pattern = method.split(":", 1)[1]
        matches = set(find_layer_type(layers, pattern))
        if not matches:
            raise RuntimeError(f"Partitioning '{method}' found no layers whose type matches "
                               f"the regex '{pattern}'")
        weights = [1 if idx in matches else 0 for idx in range(num_layers)]
        return partition_balanced(weights=weights, num_parts=num_stages)
    raise NotImplementedError(f"Partitioning method '{method}' not implemented; use one of "
                              f"{', '.join(PARTITION_METHODS)}")


__all__ = ["LayerSpec", "TiedLayerSpec", "partition_layers", "count_layer_params",
           "find_layer_type", "layer_type_name", "set_random_seed", "PARTITION_METHODS"]
