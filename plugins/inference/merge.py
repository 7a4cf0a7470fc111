"""Tensor-parallel checkpoints for inference: merging the pieces a training run (Megatron-style,
``"type": "Megatron"`` / ``training_mp_size``) or an earlier ``init_inference``
(``save_mp_checkpoint_path``) wrote one file per tensor-parallel rank, and writing those files.

A merged tensor is rebuilt from the unsplit model's shape, not from names: a piece that already
has the whole shape is replicated (tensor rank 0's is taken); otherwise the pieces are joined
along the one dimension whose lengths add up to the whole one. So any split a training
framework chose (column- or row-parallel, vocabulary-parallel embeddings) merges, and this
engine then cuts its own slice for the inference ``tp_size`` as it does for a whole checkpoint.
Megatron's fused ``query_key_value`` is joined as stored (each rank's ``[q; k; v]`` block after
the previous rank's): models whose fused projection expects ``[q; k; v]`` over all heads need
their own conversion.
"""
import json
import os

import torch

from deepspeed import comm as dist
from deepspeed.checkpoint import atomic_torch_save, atomic_write_text

DESCRIPTOR_NAME = "ds_inference_config.json"


class MergeError(ValueError):
    """Pieces that do not form a tensor of the model; the message names the key and files."""


def join_pieces(key, pieces, shape, files):
    """The whole tensor ``key`` of ``shape`` from one piece per tensor-parallel rank."""
    first = pieces[0]
    if shape is None or list(first.shape) == list(shape):
        return first
    for dim in range(first.dim()):
        others_agree = all(list(p.shape[:dim]) + list(p.shape[dim + 1:]) ==
                           list(shape[:dim]) + list(shape[dim + 1:]) for p in pieces)
        if others_agree and sum(p.shape[dim] for p in pieces) == shape[dim]:
            return torch.cat(pieces, dim=dim)
    raise MergeError(f"checkpoint tensor {key!r}: pieces {[tuple(p.shape) for p in pieces]} in "
                     f"{files} do not join into the model's shape {tuple(shape)} along any one "
                     f"dimension; is training_mp_size (the number of files) right?")


def merged_tensors(files, read, shapes):
    """``(key, whole tensor)`` for every key of the tensor-parallel rank files ``files``
    (``read(path)``: a file's ``(key, tensor)`` pairs), joined with ``shapes`` (the unsplit
    model's ``{key: shape}``); a key missing from some file is an error naming it."""
    states = [dict(read(path)) for path in files]
    for key in states[0]:
        missing = [f for f, s in zip(files, states) if key not in s]
        if missing:
            raise MergeError(f"checkpoint tensor {key!r} is in {files[0]} but not in "
                             f"{missing}: the files are not one checkpoint's tensor ranks")
        yield key, join_pieces(key, [s[key] for s in states], shapes.get(key), files)


def save_split_checkpoint(module, path, tp_size, tp_rank, dtype, tp_group=None):
    """``save_mp_checkpoint_path``: this rank's split weights into ``path/tp_rank_XX.pt`` and,
    from rank 0 once every rank's file is there, the descriptor ``ds_inference_config.json``
    that ``init_inference(checkpoint=<it>)`` loads at any ``tp_size``. Returns the descriptor's
    path. Only the tensor-parallel group holding global rank 0 writes (``tp_group``, None for
    the world group; rank 0 alone without tensor parallelism): the other data-parallel
    replicas hold the same pieces, and writing them again cost each replica a full copy of the
    model on disk."""
    os.makedirs(path, exist_ok=True)
    names = [f"tp_rank_{r:02d}.pt" for r in range(tp_size)]
    if _writes_split_files(tp_size, tp_group):
        state = {k: v.detach().cpu().clone() for k, v in module.state_dict().items()}
        atomic_torch_save(state, os.path.join(path, names[tp_rank]))
    if dist.is_initialized():
        dist.barrier()
    descriptor = os.path.join(path, DESCRIPTOR_NAME)
    if not dist.is_initialized() or dist.get_rank() == 0:
        atomic_write_text(descriptor, json.dumps({
            "type": "ds_model", "version": 1.0, "parallelization": "tp", "tp_size": tp_size,
            "dtype": str(dtype).replace("torch.", ""), "checkpoints": {"tp": names}}, indent=2))
    if dist.is_initialized():
        dist.barrier()
    return descriptor


def _writes_split_files(tp_size, tp_group):
    """Whether this rank's tensor-parallel group is the one holding global rank 0 (``tp_group``
    None with ``tp_size`` > 1: the world group)."""
    if not dist.is_initialized():
        return True
    if tp_size == 1:
        return dist.get_rank() == 0
    return tp_group is None or 0 in dist.get_all_ranks_from_group(tp_group)
