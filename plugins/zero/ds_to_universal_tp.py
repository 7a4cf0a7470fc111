"""``ds_to_universal`` of a tensor-parallel checkpoint: the pieces of each split parameter,
one per tensor-parallel rank, joined into the whole tensor a universal checkpoint stores.

The model-parallel ranks of a checkpoint (``mp_rank_XX``) are ``stage * tp + tensor rank`` (a
``PipelineParallelGrid`` numbers pipe x tensor so; without a pipeline, the tensor rank). Each
rank's part is read on its own (``deepspeed.zero.ds_to_universal_pipeline``: ZeRO fragments or
the torch optimizer state), then the ``tp`` parts of a stage become one *stage part* here: a
parameter its model states list under ``param_slices`` (``deepspeed.hooks.
UNIVERSAL_CHECKPOINT_SLICE``: ``[dim, parts, index]``) is the concatenation of the ranks'
pieces along ``dim`` in index order; any other is replicated and taken from tensor rank 0.
Loading cuts each rank's piece again for whatever tensor-parallel size it runs at.
"""
import os
from collections import OrderedDict

import torch

from deepspeed.checkpoint import universal
from deepspeed.checkpoint.atomic import CheckpointFormatError, atomic_torch_save

PARAM_SLICES = "param_slices"


def reader(part):
    """``read(name, key)``: one model-parallel rank's tensor ``key`` of parameter ``name`` (its
    piece, for a split one): in memory (torch optimizer state) or in the rank's merged files
    (ZeRO, ``part["whole_dir"]``)."""
    if "tensors" in part:
        return lambda name, key: part["tensors"][name][key]
    return lambda name, key: universal.load_param_state(part["whole_dir"], name, key,
                                                        mmap=False)


def _checked_slices(states, tp, rank, mp_rank):
    slices = {n: [int(v) for v in s] for n, s in (states.get(PARAM_SLICES) or {}).items()}
    for name, (dim, parts, index) in slices.items():
        if parts != tp or index != rank:
            raise CheckpointFormatError(
                f"model-parallel rank {mp_rank} (tensor rank {rank} of {tp}) records parameter "
                f"{name!r} as piece {index} of {parts} along dim {dim}; the checkpoint's "
                f"ranks disagree with its tensor-parallel size")
    return slices


def join_stage(parts, all_states, stage, tp):
    """The stage part of tensor ranks ``parts`` (of pipeline stage ``stage``): their groups with
    whole shapes, ``slices`` ({name: dim} of the split parameters) and ``pieces``
    ([read(name, key)] in tensor-rank order)."""
    first = parts[0]
    slices = [_checked_slices(all_states[stage * tp + t], tp, t, stage * tp + t)
              for t in range(tp)]
    groups = []
    for index, group in enumerate(first["groups"]):
        whole = OrderedDict()
        for t, part in enumerate(parts):
            if list(part["groups"][index]) != list(group):
                raise CheckpointFormatError(
                    f"pipeline stage {stage}: tensor rank {t} holds parameters "
                    f"{list(part['groups'][index])[:6]} in optimizer group {index}, tensor "
                    f"rank 0 {list(group)[:6]}; the ranks must hold the same parameters")
            if part["state_keys"][index] != first["state_keys"][index]:
                raise CheckpointFormatError(
                    f"pipeline stage {stage}, group {index}: tensor rank {t} keeps optimizer "
                    f"state {part['state_keys'][index]}, rank 0 {first['state_keys'][index]}")
        for name, shape in group.items():
            if name not in slices[0]:
                whole[name] = list(shape)
                continue
            dim = slices[0][name][0]
            if any(name not in s or s[name][0] != dim for s in slices):
                raise CheckpointFormatError(f"parameter {name!r} is split along dim {dim} on "
                                            f"tensor rank 0 but not so on every rank")
            shape = list(shape)
            shape[dim] = sum(int(p["groups"][index][name][dim]) for p in parts)
            whole[name] = shape
        groups.append(whole)
    frozen_split = set(slices[0]) & set(all_states[stage * tp].get("frozen_param_shapes") or {})
    if frozen_split or any(p["sharded_frozen"] for p in parts):
        raise CheckpointFormatError(
            f"pipeline stage {stage}: frozen parameters split over tensor ranks "
            f"{sorted(frozen_split)[:6]} or partitioned by ZeRO-3 do not convert with tensor "
            f"parallelism")
    return {**{k: first[k] for k in ("state_keys", "scalars", "hyper", "zero_stage",
                                      "dp_world_size", "sharded_frozen")},
            "groups": groups, "slices": {n: s[0] for n, s in slices[0].items()},
            "pieces": [reader(p) for p in parts]}


def write_joined(stage_part, name, keys, out_dir):
    """Parameter ``name``'s whole tensors ``keys`` (the fp32 weight and its moments) into the
    universal checkpoint ``out_dir``."""
    dim = stage_part["slices"].get(name)
    for key in keys:
        if dim is None:  # replicated: tensor rank 0's (the others may hold no copy)
            whole = stage_part["pieces"][0](name, key)
        else:
            whole = torch.cat([read(name, key) for read in stage_part["pieces"]], dim=dim)
        path = universal.param_file(out_dir, name, key)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        atomic_torch_save({"param": whole.clone()}, path)


def joined_module(all_states, tp, out_dir, stage_parts):
    """The whole module weights: each stage's tensor rank 0 entries, a split parameter's
    replaced by its joined fp32 tensor in the entry's dtype."""
    module = OrderedDict()
    for mp_rank in range(0, len(all_states), tp):
        split = stage_parts[mp_rank // tp]["slices"]
        for key, value in all_states[mp_rank]["module"].items():
            if key in split and key not in module:
                value = universal.load_param_state(out_dir, key, mmap=False).to(value.dtype)
            module.setdefault(key, value)
    return module
