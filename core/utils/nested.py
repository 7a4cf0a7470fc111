"""Mapping a function over the tensors inside nested containers, keeping each container's type.

Batches and module outputs arrive as nested lists, tuples, namedtuples and mappings (HF
``BatchEncoding`` is a UserDict, ``ModelOutput`` a dataclass-dict); code that moves or wraps the
tensors inside must hand back the same shapes of container, so callers can go on with
``model(**batch)`` or ``output.logits``.
"""
from collections.abc import Mapping

import torch


def map_tensors(value, fn):
    """``value`` with ``fn(tensor)`` in place of every tensor inside it; non-tensor leaves are
    kept as they are. A mapping type that cannot be rebuilt from a dict comes back as a dict."""
    if torch.is_tensor(value):
        return fn(value)
    if isinstance(value, Mapping):
        rebuilt = {k: map_tensors(v, fn) for k, v in value.items()}
        try:
            # ModelOutput takes its fields as keywords; dicts and UserDicts take a mapping
            return type(value)(**rebuilt) if hasattr(value, "to_tuple") else type(value)(rebuilt)
        except TypeError:
            return rebuilt
    if isinstance(value, tuple) and hasattr(value, "_fields"):  # namedtuple
        return type(value)(*(map_tensors(v, fn) for v in value))
    if isinstance(value, (list, tuple)):
        return type(value)(map_tensors(v, fn) for v in value)
    return value


def move_to_device(item, device, criterion_func=None):
    """``item`` with every tensor inside it moved to ``device`` (re-exported as
    ``deepspeed.runtime.utils.move_to_device``); with ``criterion_func``, only tensors for which
    it returns true move."""
    if criterion_func is None:
        return map_tensors(item, lambda t: t.to(device))
    return map_tensors(item, lambda t: t.to(device) if criterion_func(t) else t)
