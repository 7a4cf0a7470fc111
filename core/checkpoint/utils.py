"""``deepspeed.checkpoint.utils``: helpers the DeepSpeed docs point users at."""
import torch


def clone_tensors_for_torch_save(item, device=torch.device("cpu")):
    """A copy of ``item`` whose tensors (also inside lists, tuples and dicts) are detached
    clones on ``device``.

    ``torch.save`` writes a tensor's whole storage; a small view into a large flat buffer (as
    ZeRO keeps its partitions) would drag the entire buffer into the file. Cloning gives each
    tensor a storage of its own size. Non-tensors are returned unchanged; containers keep their
    type.
    """
    if torch.is_tensor(item):
        return item.detach().clone().to(device)
    if isinstance(item, list):
        return [clone_tensors_for_torch_save(v, device) for v in item]
    if isinstance(item, tuple):
        return tuple(clone_tensors_for_torch_save(v, device) for v in item)
    if isinstance(item, dict):
        return type(item)({k: clone_tensors_for_torch_save(v, device) for k, v in item.items()})
    return item
