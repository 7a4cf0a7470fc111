"""Universal checkpoints: one ZeRO checkpoint re-stored per parameter, so it loads under any
data-parallel size or ZeRO stage.

A ZeRO checkpoint stores flat partitions whose meaning depends on the world size and bucket
layout that wrote them. ``ds_to_universal`` rewrites one tag as whole tensors::

    <output>/
      latest_universal                    the converted tag (``latest`` too, same text)
      <tag>/
        universal_checkpoint_info.pt      groups, hyperparameters, scalar state, shapes (below)
        mp_rank_00_model_states.pt        the source's, with every module weight whole
        rng_state_rank_<r>.pt             copied from the source
        zero/<param name>/fp32.pt         {"param": full-shape fp32 master weight}
        zero/<param name>/<key>.pt        {"param": full-shape optimizer state}, one per
                                          elementwise key (exp_avg, exp_avg_sq, ...)

Each tensor file holds a dict ``{"param": tensor}`` rather than a bare tensor, so a later
version can add per-tensor metadata without a format break. Every tensor is whole, however the
source was split: a rank that holds a piece of a parameter (``deepspeed.hooks.
UNIVERSAL_CHECKPOINT_SLICE``, a tensor-parallel slice) cuts its piece out when loading
(``load_param_state(..., piece=)``), so one checkpoint loads at any split.
Frozen parameters have only ``fp32.pt``. ``universal_checkpoint_info.pt`` holds::

    format, format_version, tag, source {zero_stage, dp_world_size, ds_version, and for a
                                         pipeline or tensor-parallel source pipeline_stages,
                                         tensor_parallel_size},
    group_params   [[names] per optimizer param group]
    param_shapes   {name: [sizes]} (trainable)
    frozen_param_shapes {name: [sizes]}
    state_keys     [[elementwise optimizer state keys] per group]
    optimizer_scalars [{key: value} per group]   e.g. {"step": 2}
    param_groups   [{hyperparameter: value} per group]   (no "params")
    loss_scaler

Loading (``"checkpoint": {"load_universal": true}``) cuts the tensors for the loading
optimizer's own layout; this module only reads, so it needs neither ZeRO nor a process group.
"""
import os

import torch

from deepspeed.checkpoint.atomic import CheckpointFormatError, load_file
from deepspeed.checkpoint.constants import FP32_WEIGHT_KEY, PARAM
from deepspeed.hooks import UNIVERSAL_CHECKPOINT_NAME, UNIVERSAL_CHECKPOINT_SLICE

INFO_FILENAME = "universal_checkpoint_info.pt"
PARAMS_DIRNAME = "zero"
LATEST_UNIVERSAL_FILENAME = "latest_universal"
FORMAT = "deepspeed-universal"
FORMAT_VERSION = 1
FP32_KEY = FP32_WEIGHT_KEY


def param_dir(checkpoint_dir, name):
    if not name or name in (".", "..") or "/" in name or os.sep in name:
        raise CheckpointFormatError(f"parameter name {name!r} cannot be a directory name of a "
                                    f"universal checkpoint")
    return os.path.join(os.fspath(checkpoint_dir), PARAMS_DIRNAME, name)


def param_file(checkpoint_dir, name, key=FP32_KEY):
    """Where the full tensor ``key`` ("fp32", "exp_avg", ...) of parameter ``name`` lives."""
    return os.path.join(param_dir(checkpoint_dir, name), f"{key}.pt")


def is_universal_checkpoint(checkpoint_dir):
    return os.path.isfile(os.path.join(os.fspath(checkpoint_dir), INFO_FILENAME))


def read_info(checkpoint_dir):
    """The checkpoint's ``universal_checkpoint_info.pt``; a folder that is not a universal
    checkpoint is reported with what it is instead."""
    checkpoint_dir = os.fspath(checkpoint_dir)
    path = os.path.join(checkpoint_dir, INFO_FILENAME)
    if not os.path.isfile(path):
        present = sorted(os.listdir(checkpoint_dir)) if os.path.isdir(checkpoint_dir) else []
        hint = ("it is a ZeRO checkpoint: convert it first with `ds_to_universal --input_folder "
                "<it> --output_folder <new folder>`"
                if any(n.endswith("_optim_states.pt") for n in present)
                else f"it holds {present[:10] or 'nothing'}")
        raise CheckpointFormatError(
            f"'{checkpoint_dir}' is not a universal checkpoint (no {INFO_FILENAME}), but "
            f"\"checkpoint\": {{\"load_universal\": true}} is set; {hint}")
    info = load_file(path)
    if info.get("format") != FORMAT or int(info.get("format_version", -1)) > FORMAT_VERSION:
        raise CheckpointFormatError(
            f"'{path}' has format {info.get('format')!r} version {info.get('format_version')!r}; "
            f"this build reads {FORMAT!r} up to version {FORMAT_VERSION}")
    return info


def piece_sizes(total, parts):
    """``parts`` lengths summing to ``total``; the first ``total % parts`` are one longer (the
    rule ``UNIVERSAL_CHECKPOINT_SLICE`` declares, and tensor-parallel splitting follows)."""
    base, extra = divmod(int(total), int(parts))
    return [base + (1 if r < extra else 0) for r in range(int(parts))]


def piece_range(total, parts, index):
    """``(start, length)`` of piece ``index`` of ``total`` rows cut into ``parts``."""
    sizes = piece_sizes(total, parts)
    return sum(sizes[:index]), sizes[index]


def cut_piece(whole, piece):
    """Piece ``(dim, parts, index)`` of ``whole`` (``whole`` itself for ``piece`` None)."""
    if piece is None:
        return whole
    dim, parts, index = piece
    start, length = piece_range(whole.shape[dim], parts, index)
    return whole.narrow(dim, start, length)


def piece_shape(shape, piece):
    """The shape of piece ``piece`` of a tensor of ``shape``."""
    shape = list(shape)
    if piece is not None:
        dim, parts, index = piece
        shape[dim] = piece_range(shape[dim], parts, index)[1]
    return shape


def universal_slices(module):
    """``{id(param): (dim, parts, index)}`` of the parameters this rank holds a piece of."""
    return {id(p): tuple(getattr(p, UNIVERSAL_CHECKPOINT_SLICE))
            for p in module.parameters() if hasattr(p, UNIVERSAL_CHECKPOINT_SLICE)}


def load_param_state(checkpoint_dir, name, key=FP32_KEY, mmap=True, piece=None):
    """The full-shape tensor ``key`` of parameter ``name``, or its ``piece`` (``(dim, parts,
    index)``, see ``cut_piece``); memory-mapped unless ``mmap`` is False, so a rank reads only
    the pages of its own slice."""
    path = param_file(checkpoint_dir, name, key)
    if not os.path.isfile(path):
        where = param_dir(checkpoint_dir, name)
        have = sorted(os.listdir(where)) if os.path.isdir(where) else None
        raise FileNotFoundError(
            f"universal checkpoint file '{path}' does not exist; "
            + (f"'{where}' holds {have}" if have is not None
               else f"the checkpoint has no parameter {name!r}"))
    saved = torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    if not isinstance(saved, dict) or not torch.is_tensor(saved.get(PARAM)):
        raise CheckpointFormatError(f"'{path}' should hold {{'param': tensor}}, found "
                                    f"{type(saved).__name__}")
    return cut_piece(saved[PARAM], piece)


def read_latest_universal(folder):
    """The tag ``folder/latest_universal`` names, or None when there is none."""
    path = os.path.join(os.fspath(folder), LATEST_UNIVERSAL_FILENAME)
    if not os.path.isfile(path):
        return None
    with open(path, encoding="utf-8") as f:
        return f.read().strip() or None


def universal_names(module):
    """``{id(param): name in a universal checkpoint}``: the module name, unless the parameter
    declares another (``deepspeed.hooks.UNIVERSAL_CHECKPOINT_NAME``, an MoE expert held under
    a local index)."""
    return {id(p): getattr(p, UNIVERSAL_CHECKPOINT_NAME, n) for n, p in module.named_parameters()}


def check_group_names(checkpoint_dir, saved_groups, mine, partial):
    """Each optimizer group's parameter names (universal names) must be the checkpoint
    group's; a group marked ``partial`` (parameters declaring ``UNIVERSAL_CHECKPOINT_NAME``:
    this rank's share of the experts, a pipeline stage's layers) may hold a part of it."""
    problem = len(saved_groups) != len(mine)
    for saved, names, part in zip(saved_groups, mine, partial):
        if problem:
            break
        problem = not set(names) <= set(saved) if part else sorted(names) != sorted(saved)
    if problem:
        raise CheckpointFormatError(
            f"the universal checkpoint '{checkpoint_dir}' groups its parameters as "
            f"{[len(g) for g in saved_groups]} per optimizer group, this optimizer as "
            f"{[len(g) for g in mine]}; the model must have the same trainable parameters "
            f"in the same groups")


def load_into_optimizer(engine, checkpoint_dir):
    """``load_universal`` without ZeRO: put each parameter's fp32 weight and optimizer moments
    into the tensors the engine's basic optimizer steps (the module's own parameters in fp32
    training, the fp32 masters under bf16/fp16), then refresh the module from them."""
    info = read_info(checkpoint_dir)
    optimizer = engine.basic_optimizer
    names, pieces = universal_names(engine.module), universal_slices(engine.module)
    saved_groups = info["group_params"]
    models = [[engine.precision.model_param_of(t) for t in group["params"]]
              for group in optimizer.param_groups]
    mine = [[names[id(p)] for p in group] for group in models]
    check_group_names(checkpoint_dir, saved_groups, mine,
                      [any(hasattr(p, UNIVERSAL_CHECKPOINT_NAME) for p in g) for g in models])
    torch_step = isinstance(optimizer, torch.optim.Optimizer) and \
        type(optimizer).__module__.startswith("torch.")
    with torch.no_grad():
        for index, group in enumerate(optimizer.param_groups):
            group.update(info["param_groups"][index])
            for stepped, model, name in zip(group["params"], models[index], mine[index]):
                piece = pieces.get(id(model))
                stepped.copy_(load_param_state(checkpoint_dir, name, piece=piece)
                              .reshape(stepped.shape))
                state = {key: load_param_state(checkpoint_dir, name, key, piece=piece)
                         .reshape(stepped.shape).to(stepped.device).clone()
                         for key in info["state_keys"][index]}
                for key, value in info["optimizer_scalars"][index].items():
                    value = value.item() if torch.is_tensor(value) else value
                    # torch's own optimizers keep ``step`` as a float tensor
                    state[key] = torch.tensor(float(value)) if torch_step and key == "step" \
                        else value
                optimizer.state[stepped] = state
    engine.precision.after_optimizer_step()


def module_pieces(module, saved_module):
    """``saved_module`` (a universal checkpoint's whole module weights) with each entry of a
    parameter this rank holds a piece of (``UNIVERSAL_CHECKPOINT_SLICE``) cut to that piece: what
    a loader that copies the state dict as a whole (ZeRO-3's) can take at any tensor-parallel
    size."""
    pieces = {name: tuple(getattr(p, UNIVERSAL_CHECKPOINT_SLICE))
              for name, p in module.named_parameters() if hasattr(p, UNIVERSAL_CHECKPOINT_SLICE)}
    return {key: cut_piece(value, pieces.get(key)) if torch.is_tensor(value) else value
            for key, value in (saved_module or {}).items()}


def load_module_weights(module, checkpoint_dir, saved_module):
    """Every parameter of ``module`` from its whole fp32 tensor in the universal checkpoint
    (this rank's piece of it, cast to the parameter's dtype), buffers from ``saved_module``
    (the converted model states' ``module``). Per parameter rather than ``load_state_dict``,
    because a rank may hold a piece of a parameter or only some of the model (a pipeline
    stage). Returns ``(missing, unexpected)`` as ``load_state_dict`` does."""
    info = read_info(checkpoint_dir)
    stored = {**info["param_shapes"], **info.get("frozen_param_shapes", {})}
    names, pieces = universal_names(module), universal_slices(module)
    missing = []
    with torch.no_grad():
        for name, param in module.named_parameters():
            universal_name = names[id(param)]
            if universal_name not in stored:
                missing.append(name)
                continue
            piece = pieces.get(id(param))
            value = load_param_state(checkpoint_dir, universal_name, piece=piece)
            if list(value.shape) != list(param.shape):
                raise CheckpointFormatError(
                    f"parameter {name!r}: the universal checkpoint '{checkpoint_dir}' holds "
                    f"{universal_name!r} with shape {tuple(stored[universal_name])}, whose "
                    f"piece {piece} is {tuple(value.shape)}; this model's is "
                    f"{tuple(param.shape)}")
            param.copy_(value)
    # persistent buffers: the state-dict entries that are no parameter
    persistent = set(module.state_dict()) - {n for n, _ in module.named_parameters(
        remove_duplicate=False)}
    saved = {k: v for k, v in (saved_module or {}).items() if k in persistent}
    module.load_state_dict(saved, strict=False)
    return missing + sorted(persistent - set(saved)), []
