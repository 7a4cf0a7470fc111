"""``ds_to_universal`` of a tensor-parallel checkpoint: the pieces of each split parameter,
one per tensor-parallel rank, joined into the whole tensor a universal checkpoint stores.

The model-parallel ranks of a checkpoint (``mp_rank_XX``) are ``stage * tp + tensor rank`` (a
``PipelineParallelGrid`` numbers pipe x tensor so; without a pipeline, the tensor rank). Each
rank's part is read on its own (``deepspeed.zero.ds_to_universal_pipeline``: ZeRO fragments or
the torch optimizer state), then the ``tp`` parts of a stage become one *stage part* here: a
parameter its model states list under ``param_slices`` (``deepspeed.hooks.
UNIVERSAL_CHECKPOINT_SLICE``: ``[dim, parts, index]``) is the concatenation of the ranks'
pieces along ``dim`` in index order; any other is replicated and taken from tensor rank 0.
Frozen parameters are joined the same way (``write_frozen``): each rank's piece is its module
weight, or under ZeRO-3 its merged shards. Loading cuts each rank's piece again for whatever
tensor-parallel size it runs at.
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
    frozen = list(all_states[stage * tp].get("frozen_param_shapes") or {})
    return {**{k: first[k] for k in ("state_keys", "scalars", "hyper", "zero_stage",
                                      "dp_world_size")},
            "groups": groups, "slices": {n: s[0] for n, s in slices[0].items()},
            "pieces": [reader(p) for p in parts],
            # frozen parameters (ZeRO-3 shards already merged per rank): joined by write_frozen
            "sharded_frozen": {}, "frozen": frozen,
            "frozen_pieces": [_frozen_reader(p, all_states[stage * tp + t])
                              for t, p in enumerate(parts)]}


def _frozen_reader(part, states):
    """``read(name)``: one tensor rank's piece of frozen parameter ``name``: its merged ZeRO-3
    shards, else the module weight its model states hold (None when the save left it out,
    ``exclude_frozen_parameters``)."""
    module, read = states.get("module") or {}, reader(part)

    def read_frozen(name):
        if name in part["sharded_frozen"]:
            return read(name, universal.FP32_KEY)
        value = module.get(name)
        return None if value is None or value.numel() == 0 else value.float()
    return read_frozen


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


def write_frozen(stage_part, out_dir, done):
    """The stage's frozen parameters not in ``done`` into ``out_dir`` as whole fp32 tensors (a
    split one's pieces joined along its dim, like a trained one's); returns ``{name: whole
    shape}``. Frozen parameters the save left out (``exclude_frozen_parameters``) are skipped."""
    written = OrderedDict()
    for name in stage_part["frozen"]:
        if name in done:
            continue
        pieces = [read(name) for read in stage_part["frozen_pieces"]]
        if any(p is None for p in pieces):
            continue
        dim = stage_part["slices"].get(name)
        whole = pieces[0] if dim is None else torch.cat(pieces, dim=dim)
        path = universal.param_file(out_dir, name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        atomic_torch_save({"param": whole.clone()}, path)
        written[name] = list(whole.shape)
    return written


def joined_module(all_states, tp, out_dir, stage_parts, shapes):
    """The whole module weights: each stage's tensor rank 0 entries, a split parameter's (or an
    empty ZeRO-3 placeholder's) replaced by its whole fp32 tensor (``shapes``: the trained and
    frozen parameters' whole shapes) in the entry's dtype."""
    module = OrderedDict()
    for mp_rank in range(0, len(all_states), tp):
        split = stage_parts[mp_rank // tp]["slices"]
        for key, value in all_states[mp_rank]["module"].items():
            placeholder = key in shapes and value.numel() != torch.Size(shapes[key]).numel()
            if (key in split or placeholder) and key not in module:
                value = universal.load_param_state(out_dir, key, mmap=False).to(value.dtype)
            module.setdefault(key, value)
    return module
