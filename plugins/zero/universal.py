"""Loading a universal checkpoint (``deepspeed.checkpoint.universal``) into a ZeRO optimizer.

A universal checkpoint stores every parameter and optimizer moment whole, so each rank cuts
its partition straight from them for the optimizer's *current* layout (any world size,
bucket size or stage 1-3) and installs it like one of its own checkpoints. Each rank reads
(memory-mapped) only the parameters its partition touches. A param group partitioned over its
own process group (MoE experts, ``deepspeed.hooks.GRADIENT_GROUP``) is cut for that group, and
its parameters are read by their universal names (``UNIVERSAL_CHECKPOINT_NAME``: an expert
under its index in the model holding every expert).
"""
import torch

from deepspeed.checkpoint.universal import FP32_KEY, load_param_state, piece_shape, read_info
from deepspeed.zero import partition as layout_math
from deepspeed.hooks import UNIVERSAL_CHECKPOINT_NAME, UNIVERSAL_CHECKPOINT_SLICE
from deepspeed.zero.partition_state import (ZeroCheckpointError, frozen_zero3_params,
                                            load_partition_state_dict)


def _check_groups(info, described, checkpoint_dir, partial, pieces):
    """Every group's parameters are the checkpoint group's (``partial``: a part of them, this
    rank's experts or pipeline stage), with the checkpoint's sizes (of this rank's piece, for
    a parameter in ``pieces``)."""
    saved = info["group_params"]
    if len(saved) != len(described):
        raise ZeroCheckpointError(
            f"the universal checkpoint '{checkpoint_dir}' has {len(saved)} optimizer param "
            f"groups, this optimizer has {len(described)}")
    shapes = info["param_shapes"]
    for group, (names, buckets) in enumerate(zip(saved, described)):
        mine = {n: k for b in buckets for n, k in zip(b["params"], b["numels"])}
        if not (set(mine) <= set(names) if partial[group] else set(names) == set(mine)):
            raise ZeroCheckpointError(
                f"param group {group}: the universal checkpoint holds parameters that differ "
                f"from this model's in {sorted(set(names) ^ set(mine))[:10]}; the model must "
                f"have the same trainable parameters in the same groups")
        for name, numel in mine.items():
            if int(torch.Size(piece_shape(shapes[name], pieces.get(name))).numel()) != int(numel):
                raise ZeroCheckpointError(
                    f"parameter {name!r}: the universal checkpoint holds shape "
                    f"{tuple(shapes[name])} (this rank's piece: {pieces.get(name)}), this model "
                    f"has {numel} elements")


def _cut(checkpoint_dir, described, world_size, rank, key, pieces):
    """This rank's flat partition of tensor ``key`` of one group (padding zero), out of this
    rank's piece of each parameter (``pieces``: tensor-parallel slices)."""
    needed = sorted({name for name, *_ in
                     layout_math.partition_ranges(described, world_size, rank)})
    whole = {n: load_param_state(checkpoint_dir, n, key, piece=pieces.get(n)).reshape(-1)
             for n in needed}
    dtype = next(iter(whole.values())).dtype if whole else torch.float32
    return layout_math.split(described, world_size, rank, whole, dtype=dtype)


def universal_partition_state_dict(opt, checkpoint_dir):
    """A ``partition_state_dict`` (see ``deepspeed.zero.partition_state``) for this rank of
    ``opt``'s current layout, built from the universal checkpoint in ``checkpoint_dir``."""
    info = read_info(checkpoint_dir)
    names, partial, pieces = dict(opt.param_names), [], {}
    for layout in opt.layouts:
        params = [p for bucket in layout.buckets for p in bucket.params]
        names.update({id(p): getattr(p, UNIVERSAL_CHECKPOINT_NAME, names.get(id(p)))
                      for p in params})
        pieces.update({names[id(p)]: tuple(getattr(p, UNIVERSAL_CHECKPOINT_SLICE))
                       for p in params if hasattr(p, UNIVERSAL_CHECKPOINT_SLICE)})
        partial.append(any(hasattr(p, UNIVERSAL_CHECKPOINT_NAME) for p in params))
    described = layout_math.describe(opt.layouts, names)
    _check_groups(info, described, checkpoint_dir, partial, pieces)
    comms = getattr(opt, "group_comms", None)
    fp32, states = [], []
    for group, buckets in enumerate(described):
        # a group partitioned over its own process group (MoE experts) is cut for it
        world, rank = (comms[group][2], comms[group][1]) if comms else (opt.world_size, opt.rank)
        fp32.append(_cut(checkpoint_dir, buckets, world, rank, FP32_KEY, pieces))
        states.append({key: _cut(checkpoint_dir, buckets, world, rank, key, pieces)
                       for key in info["state_keys"][group]})
    frozen = {}
    for name, param in frozen_zero3_params(opt).items():
        if name not in info["frozen_param_shapes"]:
            raise ZeroCheckpointError(f"the frozen parameter {name!r} is not in the universal "
                                      f"checkpoint '{checkpoint_dir}'")
        # this rank's piece of a frozen parameter split over tensor ranks
        piece = getattr(param, UNIVERSAL_CHECKPOINT_SLICE, None)
        frozen[name] = load_param_state(checkpoint_dir, name, FP32_KEY, mmap=False,
                                        piece=None if piece is None else tuple(piece)).clone()
    return {
        "zero_stage": opt.stage, "partition_count": opt.partition_count, "layout": described,
        "single_partition_of_fp32_groups": fp32, "optimizer_state": states,
        "optimizer_scalars": info["optimizer_scalars"], "param_groups": info["param_groups"],
        "frozen_shards": None, "frozen_full": frozen, "loss_scaler": info.get("loss_scaler"),
        "overflow": False,
    }


def load_universal_checkpoint(opt, checkpoint_dir):
    """Restore ``opt`` (fp32 partitions, moments, scalars, hyperparameters, frozen ZeRO-3
    shards, and the module weights derived from the fp32 partitions)."""
    load_partition_state_dict(opt, universal_partition_state_dict(opt, checkpoint_dir))
