"""What a checkpointed segment keeps of its inputs between forward and backward, and how the
inputs are rebuilt for the recompute.

Three independent memory savings apply to the saved inputs:

- partition_activations: a floating-point input is split evenly across the model-parallel group
  (the ranks hold identical copies of it, so each keeps 1/mp of it) and all-gathered back in
  backward;
- contiguous_memory_optimization: those partitions are copied into preallocated buffers;
- cpu_checkpointing: what is kept lives in host memory and returns to its device in backward.
  (The docs tie this to partitioning; here it also applies to unpartitioned inputs, because
  moving a saved tensor to the host needs nothing from partitioning.)
"""
from dataclasses import dataclass
from typing import Any, List, Sequence, Tuple

import torch

from deepspeed import comm as dist
from deepspeed.activation_checkpointing.buffers import ContiguousBuffers
from deepspeed.activation_checkpointing.settings import (CheckpointingSettings,
                                                         model_parallel_group, model_parallel_rank,
                                                         model_parallel_world_size)

HOST = torch.device("cpu")


@dataclass(frozen=True)
class _Value:
    """A non-tensor argument, passed back to the recompute as is."""

    value: Any


@dataclass(frozen=True)
class _Saved:
    """A tensor argument kept as `saved_tensors[index]` (whole or one partition of it)."""

    index: int
    shape: torch.Size
    dtype: torch.dtype
    device: torch.device
    requires_grad: bool
    partitioned: bool


def is_partitionable(tensor: torch.Tensor, mp_size: int) -> bool:
    """Activations are floating point; masks, token ids and tensors smaller than the group
    (often scalars) are kept whole."""
    return tensor.is_floating_point() and tensor.numel() >= mp_size


def _partition(tensor: torch.Tensor, position: int, mp_size: int, mp_rank: int) -> torch.Tensor:
    numel = tensor.numel()
    if numel % mp_size != 0:
        raise AssertionError(
            f"partition_activations: checkpoint argument {position} has shape "
            f"{tuple(tensor.shape)} ({numel} elements), which does not split evenly across "
            f"{mp_size} model-parallel ranks")
    size = numel // mp_size
    return tensor.detach().reshape(-1).narrow(0, mp_rank * size, size)


def stash_inputs(args: Sequence[Any], settings: CheckpointingSettings,
                 buffers: ContiguousBuffers) -> Tuple[List[torch.Tensor], List[Any]]:
    """Return (tensors for `ctx.save_for_backward`, the plan `restore_inputs` follows)."""
    mp_size = model_parallel_world_size(settings.mpu)
    mp_rank = model_parallel_rank(settings.mpu)
    saved: List[torch.Tensor] = []
    plan: List[Any] = []
    for position, arg in enumerate(args):
        if not torch.is_tensor(arg):
            plan.append(_Value(arg))
            continue
        target = HOST if settings.checkpoint_in_cpu else arg.device
        partitioned = settings.partition_activations and is_partitionable(arg, mp_size)
        if partitioned:
            part = _partition(arg, position, mp_size, mp_rank)
            if buffers.enabled:
                kept = buffers.store(position, part, target)
            elif target != arg.device:
                kept = part.to(target)
            elif mp_size > 1:
                kept = part.clone()  # not a view: the full activation must be freeable
            else:
                kept = part
        else:
            kept = arg if target == arg.device else arg.detach().to(target)
        plan.append(_Saved(len(saved), arg.shape, arg.dtype, arg.device, arg.requires_grad,
                           partitioned))
        saved.append(kept)
    return saved, plan


def _gather(part: torch.Tensor, entry: _Saved, settings: CheckpointingSettings) -> torch.Tensor:
    part = part.to(entry.device, non_blocking=part.is_pinned())
    mp_size = model_parallel_world_size(settings.mpu)
    if mp_size == 1:
        return part.view(entry.shape)
    full = torch.empty(part.numel() * mp_size, dtype=entry.dtype, device=entry.device)
    dist.all_gather_into_tensor(full, part.contiguous(), group=model_parallel_group(settings.mpu))
    return full.view(entry.shape)


def restore_inputs(saved_tensors: Sequence[torch.Tensor], plan: Sequence[Any],
                   settings: CheckpointingSettings) -> List[Any]:
    """The forward's arguments, rebuilt as fresh leaves (tensors requiring grad where the
    originals did) so the recompute's backward stops at them."""
    inputs: List[Any] = []
    for entry in plan:
        if isinstance(entry, _Value):
            inputs.append(entry.value)
            continue
        kept = saved_tensors[entry.index]
        if entry.partitioned:
            tensor = _gather(kept, entry, settings)
        else:
            tensor = kept.to(entry.device, non_blocking=kept.is_pinned())
        inputs.append(tensor.detach().requires_grad_(entry.requires_grad))
    return inputs
