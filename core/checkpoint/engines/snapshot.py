"""A host-memory copy of a checkpoint state that later training steps cannot change.

The optimizer updates parameters in place; a background writer that read them directly would
store a mix of two steps. Every tensor storage is therefore copied once, on the host, before
``save_checkpoint`` returns. Storages (not tensors) are copied, and views are rebuilt on the
copies, so tensors that shared memory still share it: ``torch.save`` of the snapshot writes
the same bytes as ``torch.save`` of the original would have.
"""
from collections.abc import Mapping

import torch


def _copy_tensor(tensor, storages):
    source = tensor.untyped_storage()
    # empty storages all have data_ptr 0: never treat them as shared
    key = (tensor.device, source.data_ptr()) if source.nbytes() else object()
    storage = storages.get(key)
    if storage is None:
        storage = storages[key] = (source.clone() if tensor.device.type == "cpu"
                                   else source.cpu())
    copy = torch.empty(0, dtype=tensor.dtype).set_(storage, tensor.storage_offset(),
                                                   tensor.size(), tensor.stride())
    if isinstance(tensor, torch.nn.Parameter):
        return torch.nn.Parameter(copy, requires_grad=tensor.requires_grad)
    if tensor.requires_grad:
        copy.requires_grad_(True)
    return copy


def _copy(obj, storages, memo):
    if isinstance(obj, torch.Tensor):
        if obj.layout != torch.strided:
            return obj.detach().to("cpu", copy=True)
        if id(obj) not in memo:
            memo[id(obj)] = _copy_tensor(obj, storages)
        return memo[id(obj)]
    if isinstance(obj, Mapping):
        items = [(k, _copy(v, storages, memo)) for k, v in obj.items()]
        if type(obj) is dict:
            return dict(items)
        rebuilt = type(obj)()
        rebuilt.update(items)
        # a state_dict's OrderedDict carries ``_metadata`` (module versions) as an attribute
        rebuilt.__dict__.update(getattr(obj, "__dict__", {}))
        return rebuilt
    if type(obj) is list:
        return [_copy(v, storages, memo) for v in obj]
    if type(obj) is tuple:
        return tuple(_copy(v, storages, memo) for v in obj)
    return obj


def host_snapshot(state):
    """``state`` with every tensor copied to CPU memory of its own (sharing preserved)."""
    return _copy(state, {}, {})
