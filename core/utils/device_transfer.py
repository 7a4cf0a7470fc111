"""Moving nested batches between devices (re-exported as `deepspeed.runtime.utils.move_to_device`)."""
from collections.abc import Mapping

import torch


def move_to_device(item, device, criterion_func=None):
    """``item`` with every tensor inside it (nested lists, tuples, dicts, including HF
    ``BatchEncoding`` and namedtuples) moved to ``device``; other values are kept as they are.
    With ``criterion_func``, only tensors for which it returns true move. Containers keep their
    type so a batch can be passed on with ``model(**batch)``."""
    if torch.is_tensor(item):
        if criterion_func is None or criterion_func(item):
            return item.to(device)
        return item
    if isinstance(item, Mapping):  # dicts and UserDicts such as HF BatchEncoding
        moved = {k: move_to_device(v, device, criterion_func) for k, v in item.items()}
        try:
            return type(item)(moved)
        except TypeError:  # a mapping type that cannot be built from a dict
            return moved
    if isinstance(item, tuple) and hasattr(item, "_fields"):  # namedtuple
        return type(item)(*(move_to_device(v, device, criterion_func) for v in item))
    if isinstance(item, (list, tuple)):
        return type(item)(move_to_device(v, device, criterion_func) for v in item)
    return item
