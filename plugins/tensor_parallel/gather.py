"""The whole model's weights from tensor-parallel shards: what ``save_16bit_model``,
``_consolidated_16bit_state_dict`` (Accelerate / the HF Trainer's save) and Transformers'
``from_pretrained`` afterwards need, with the unsplit model's names and shapes.

Only the tensor-parallel group holding global rank 0 takes part (the other groups hold the
same weights: data-parallel replicas, or ZeRO-1/2 partitions already published into the
module after each step), so the gather costs one all-gather per split tensor in one group.
"""
import os

import torch

from deepspeed import comm as dist
from deepspeed.checkpoint.model_state import module_state_dict
from deepspeed.tensor_parallel.layers import PARTITION_DIM, TENSOR_MODEL_PARALLEL


def full_state_dict(module, unit, exclude_frozen_parameters=False):
    """The unsplit ``state_dict`` on global rank 0, None on every other rank. Collective over
    the tensor-parallel group of rank 0 (every rank may call it; the others return at once)."""
    if unit.get_data_parallel_rank() != 0:
        return None
    group, size = unit.get_tensor_model_parallel_group(), unit.tp_size
    split = {name: param for name, param in module.named_parameters(remove_duplicate=False)
             if getattr(param, TENSOR_MODEL_PARALLEL, False)}
    local = module_state_dict(module, exclude_frozen_parameters)
    full = {}
    for name, tensor in local.items():  # the same order on every rank of the group
        param = split.get(name)
        if param is None:
            full[name] = tensor
            continue
        full[name] = _gather_along(tensor, getattr(param, PARTITION_DIM), group, size)
    return full if dist.get_rank() == 0 else None


def _gather_along(tensor, dim, group, size):
    """The group's slices of one tensor joined along ``dim``; slices may differ in length
    there (AutoTP cuts a size ``tp_size`` does not divide unevenly), so each is padded to the
    longest for the all-gather and trimmed after."""
    lengths = [torch.zeros(1, dtype=torch.int64) for _ in range(size)]
    dist.all_gather(lengths, torch.tensor([tensor.shape[dim]], dtype=torch.int64), group=group)
    lengths = [int(n) for n in lengths]
    longest = max(lengths)
    padded = tensor.contiguous()
    if tensor.shape[dim] < longest:
        shape = list(tensor.shape)
        shape[dim] = longest - tensor.shape[dim]
        padded = torch.cat([padded, padded.new_zeros(shape)], dim=dim)
    pieces = [torch.empty_like(padded) for _ in range(size)]
    dist.all_gather(pieces, padded, group=group)
    return torch.cat([p.narrow(dim, 0, n) for p, n in zip(pieces, lengths)], dim=dim)


def save_full_model(module, unit, save_dir, save_filename, exclude_frozen_parameters=False):
    """Write the unsplit ``state_dict`` to ``save_dir/save_filename`` from global rank 0."""
    from deepspeed.checkpoint import atomic_torch_save

    state = full_state_dict(module, unit, exclude_frozen_parameters)
    if state is not None:
        os.makedirs(save_dir, exist_ok=True)
        atomic_torch_save({k: v.detach().cpu() for k, v in state.items()},
                          os.path.join(os.fspath(save_dir), save_filename))
    return True
