"""Tensor-parallel checkpoints for inference: merging the pieces a training run (Megatron-style,
``"type": "Megatron"`` / ``training_mp_size``) or an earlier ``init_inference``
(``save_mp_checkpoint_path``) wrote one file per tensor-parallel rank, and writing those files.

A merged tensor is rebuilt from the unsplit model's shape, not from names: a piece that already
has the whole shape is replicated (tensor rank 0's is taken); otherwise the pieces are joined
along the one dimension whose lengths add up to the whole one. So any split a training
framework chose (column- or row-parallel, vocabulary-parallel embeddings) merges, and this
engine then cuts its own slice for the inference ``tp_size`` as it does for a whole checkpoint.
Megatron's fused ``query_key_value`` (weight and bias) is the exception: its pieces are
reordered into ``[q (all heads); k (all heads); v (all heads)]``, the layout of a fused
projection computing ``q, k, v = qkv(x).chunk(3, -1)``, from the per-rank layout the descriptor's
``"version"`` (Megatron's checkpoint version) names:

- ``0``: each rank's rows are ``[3, heads_r, head_dim]`` (its heads' q, then k, then v);
- ``1``: ``[heads_r, head_dim, 3]`` (q, k and v interleaved row by row);
- ``2`` and ``3``: ``[heads_r, 3, head_dim]`` (per head, its q, k and v rows).

A model laid out per head instead (``config.model_type`` bloom, gpt_neox, gpt_neox_japanese,
persimmon: its attention views the output as ``(..., heads, 3, head_dim)``) gets
``[heads, 3, head_dim]`` back, and its TP split is a plain row split (whole heads per rank).
Versions 1-3 and per-head models need the head count: the model's own (``num_attention_heads``, ``num_heads``,
``n_head`` or ``n_heads`` on the module holding ``query_key_value`` or an ancestor, or on their
``config``); another version is refused, naming it. With such a checkpoint and ``tp_size`` > 1
the model's ``query_key_value`` Linears are split as fused (``deepspeed.tensor_parallel.
FUSED_BLOCKS``: each rank takes its heads' rows of q, of k and of v); ``save_mp_checkpoint_path``
then lists them in its descriptor (``"fused_qkv"``), and loading it merges them as version 0.
"""
import json
import os

import torch

from deepspeed import comm as dist
from deepspeed.checkpoint import atomic_torch_save, atomic_write_text
from deepspeed.tensor_parallel import FUSED_BLOCKS

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


FUSED_QKV = "query_key_value"
# Megatron's checkpoint versions -> the per-rank row layout of query_key_value, as the axes of
# a [3, heads_r, head_dim] view ("b": the q/k/v block, "h": head, "d": row within the head)
MEGATRON_QKV_LAYOUTS = {0: "bhd", 1: "hdb", 2: "hbd", 3: "hbd"}
HEAD_COUNT_NAMES = ("num_attention_heads", "num_heads", "n_head", "n_heads")
# models whose fused projection is laid out per head ([heads, 3, head_dim]: the attention views
# its output as (..., heads, 3, head_dim)) rather than [q; k; v] over all heads
PER_HEAD_QKV_MODEL_TYPES = ("bloom", "gpt_neox", "gpt_neox_japanese", "persimmon")


def fused_qkv_plan(descriptor, model, where):
    """``{checkpoint key: (layout, heads)}`` of the fused ``query_key_value`` weights and biases
    of ``model`` that a ``"type": "Megatron"`` descriptor's pieces are reordered for (see the
    module docstring), or that a ``save_mp_checkpoint_path`` descriptor lists as split fused
    (``"fused_qkv"``: each rank's ``[q_r; k_r; v_r]``, version 0's layout); empty for any
    other descriptor. Call before the model is split (its head counts are the whole model's)."""
    if descriptor.get("parallelization") == "tp":
        return {key: (MEGATRON_QKV_LAYOUTS[0], None, "bhd")
                for key in descriptor.get("fused_qkv", ())}
    fused = [(n, m) for n, m in model.named_modules() if n.split(".")[-1] == FUSED_QKV]
    if descriptor.get("type") != "Megatron" or not fused:
        return {}
    raw = descriptor.get("version", 0)
    try:
        version = float(raw)
    except (TypeError, ValueError):
        version = None
    if version is None or not version.is_integer() or int(version) not in MEGATRON_QKV_LAYOUTS:
        raise MergeError(f"checkpoint {where}: \"version\": {raw!r} is not a Megatron checkpoint "
                         f"version whose query_key_value layout this build knows; known: "
                         f"{sorted(MEGATRON_QKV_LAYOUTS)}")
    layout = MEGATRON_QKV_LAYOUTS[int(version)]
    target = "hbd" if _per_head_model(model) else "bhd"
    plan = {}
    for name, module in fused:
        per_head = layout != "bhd" or target != "bhd"
        heads = _head_count(model, name, where, raw) if per_head else None
        for key, _ in module.named_parameters(prefix=name, recurse=False):
            plan[key] = (layout, heads, target)
    return plan


def _per_head_model(model):
    config = getattr(model, "config", None)
    return getattr(config, "model_type", None) in PER_HEAD_QKV_MODEL_TYPES


def mark_fused_qkv(model, plan):
    """Mark the Linears whose weights ``plan`` reorders as fused ``[q; k; v]``
    (``FUSED_BLOCKS``), so a tensor-parallel split gives each rank its heads' rows of each
    (a per-head layout needs no mark: a plain row split gives each rank whole heads)."""
    for key, (_layout, _heads, target) in plan.items():
        if target != "bhd":
            continue
        owner = model.get_submodule(key.rsplit(".", 1)[0])
        if isinstance(owner, torch.nn.Linear):
            setattr(owner, FUSED_BLOCKS, 3)


def _head_count(model, name, where, version):
    path = name.split(".")
    for depth in range(len(path) - 1, -1, -1):
        owner = model.get_submodule(".".join(path[:depth]))
        for holder in (owner, getattr(owner, "config", None)):
            for attr in HEAD_COUNT_NAMES:
                value = getattr(holder, attr, None)
                if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                    return value
    raise MergeError(f"checkpoint {where}: Megatron version {version} interleaves the heads of "
                     f"{name!r}, and none of its modules names a head count "
                     f"({', '.join(HEAD_COUNT_NAMES)}, or on their config); set one, or convert "
                     f"the checkpoint to version 0")


def join_fused_qkv(key, pieces, layout, heads, target, files):
    """Megatron ranks' ``query_key_value`` pieces (rows in ``layout``, see
    ``MEGATRON_QKV_LAYOUTS``) as one tensor in the model's ``target`` layout: ``"bhd"``
    (``[q (all heads); k (all heads); v (all heads)]``) or ``"hbd"`` (per head)."""
    blocks = []
    for piece in pieces:
        rows, rest = piece.shape[0], list(piece.shape[1:])
        heads_r = 1 if heads is None else heads // len(pieces)
        if heads is not None and heads % len(pieces):
            raise MergeError(f"checkpoint tensor {key!r}: {heads} heads do not split over the "
                             f"{len(pieces)} ranks of {files}")
        if rows % (3 * heads_r):
            raise MergeError(f"checkpoint tensor {key!r}: {rows} rows in {files} are not 3 x "
                             f"{heads_r} heads x head_dim (Megatron layout {layout!r})")
        sizes = {"b": 3, "h": heads_r, "d": rows // (3 * heads_r)}
        view = piece.reshape([sizes[a] for a in layout] + rest)
        order = [layout.index(a) for a in "bhd"] + list(range(3, 3 + len(rest)))
        blocks.append(view.permute(order).reshape([3, -1] + rest))
    whole = torch.cat(blocks, dim=1)  # [3, heads x head_dim, ...]
    if target == "hbd":
        rest = list(pieces[0].shape[1:])
        whole = whole.reshape([3, heads, -1] + rest).transpose(0, 1)
    return whole.reshape([-1] + list(pieces[0].shape[1:]))


def merged_tensors(files, read, shapes, fused=None):
    """``(key, whole tensor)`` for every key of the tensor-parallel rank files ``files``
    (``read(path)``: a file's ``(key, tensor)`` pairs), joined with ``shapes`` (the unsplit
    model's ``{key: shape}``), a key of ``fused`` (``fused_qkv_plan``) reordered by
    ``join_fused_qkv``; a key missing from some file is an error naming it."""
    states = [dict(read(path)) for path in files]
    fused = fused or {}
    for key in states[0]:
        missing = [f for f, s in zip(files, states) if key not in s]
        if missing:
            raise MergeError(f"checkpoint tensor {key!r} is in {files[0]} but not in "
                             f"{missing}: the files are not one checkpoint's tensor ranks")
        pieces = [s[key] for s in states]
        if key in fused:
            yield key, join_fused_qkv(key, pieces, *fused[key], files)
        else:
            yield key, join_pieces(key, pieces, shapes.get(key), files)


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
    fused = [f"{name}.{key}" for name, m in module.named_modules()
             if getattr(m, FUSED_BLOCKS, None) for key, _ in m.named_parameters(recurse=False)]
    if _writes_split_files(tp_size, tp_group):
        state = {k: v.detach().cpu().clone() for k, v in module.state_dict().items()}
        atomic_torch_save(state, os.path.join(path, names[tp_rank]))
    if dist.is_initialized():
        dist.barrier()
    descriptor = os.path.join(path, DESCRIPTOR_NAME)
    if not dist.is_initialized() or dist.get_rank() == 0:
        content = {"type": "ds_model", "version": 1.0, "parallelization": "tp",
                   "tp_size": tp_size, "dtype": str(dtype).replace("torch.", ""),
                   "checkpoints": {"tp": names}}
        if fused:  # each rank holds [q_r; k_r; v_r] of these: merged as Megatron version 0
            content["fused_qkv"] = fused
        atomic_write_text(descriptor, json.dumps(content, indent=2))
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
