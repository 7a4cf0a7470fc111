"""A rank's ZeRO optimizer state as a *partition state dict*, and installing one.

The partition state dict holds plain tensors in partition coordinates: the rank's fp32
partition, its elementwise optimizer state cut the same way, per-group scalars and
hyperparameters, the layout that gives those coordinates their meaning
(``deepspeed.zero.partition.describe``) and, under ZeRO-3, the shards of frozen parameters. It
does not depend on how the partition is split into optimizer sub-groups.

Every way of restoring an optimizer ends here: a rank's own file (``checkpointing``), a re-cut
of all ranks' files for a new layout (``checkpointing.reshape``), and a universal checkpoint
(``universal``). It is its own module so that those two readers depend on it and not on each
other.
"""
import torch

from deepspeed.checkpoint.constants import (DS_VERSION, LOSS_SCALER, PARAM_GROUPS, PARTITION_COUNT,
                                            SINGLE_PARTITION_OF_FP32_GROUPS, ZERO_STAGE)
from deepspeed.version import __version__
from deepspeed.zero import partition as layout_math


class ZeroCheckpointError(RuntimeError):
    """A ZeRO checkpoint that cannot be loaded into this engine as configured."""


def _is_elementwise(value, numel):
    return torch.is_tensor(value) and value.dim() == 1 and value.numel() == numel


def partition_state_dict(opt):
    """This rank's state as plain tensors in partition coordinates (independent of how the
    partition is cut into optimizer sub-groups)."""
    fp32, states, scalars = [], [], []
    for chunks in opt.chunks:
        flat_parts, state_parts, group_scalars = [], {}, {}
        for chunk in chunks:
            opt._swap_in(chunk)
            flat_parts.append(chunk.detach().clone())
            for key, value in opt.optimizer_for(chunk).state.get(chunk, {}).items():
                if _is_elementwise(value, chunk.numel()):
                    state_parts.setdefault(key, []).append(value.detach().clone())
                else:
                    group_scalars.setdefault(key, value.clone() if torch.is_tensor(value)
                                             else value)
            opt._swap_out(chunk)
        fp32.append(torch.cat(flat_parts) if flat_parts else torch.zeros(0))
        states.append({k: torch.cat(v) for k, v in state_parts.items()})
        scalars.append(group_scalars)
    hyper = [{k: v for k, v in group.items() if k != "params"}
             for group in opt.optimizer.param_groups]
    return {
        "frozen_shards": _frozen_shards(opt),
        ZERO_STAGE: opt.stage,
        PARTITION_COUNT: opt.partition_count,  # MiCS: the shard size, not the dp size
        "partition_replicas": opt.world_size // opt.partition_count,
        "layout": layout_math.describe(opt.layouts, opt.param_names),
        SINGLE_PARTITION_OF_FP32_GROUPS: fp32,
        "optimizer_state": states,
        "optimizer_scalars": scalars,
        PARAM_GROUPS: hyper,
        LOSS_SCALER: opt.loss_scaler.state_dict() if opt.loss_scaler is not None else None,
        "overflow": bool(opt.overflow),
        DS_VERSION: str(__version__),
    }


def frozen_zero3_params(opt):
    """ZeRO-3 parameters no optimizer partition covers (frozen ones): their shards are only
    on the ranks, so each rank's file carries its own."""
    owned = {id(p) for params in opt.partitioned_params for p in params}
    return {name: p for name, p in opt.module.named_parameters()
            if hasattr(p, "ds_id") and id(p) not in owned and not p.ds_persist}


def _frozen_shards(opt):
    out = {}
    for name, param in frozen_zero3_params(opt).items():
        out[name] = param.ds_partitioner.fetch(param).detach().clone()
        param.ds_partitioner.settle(param)
    return out


def _restore_frozen(opt, saved):
    params = frozen_zero3_params(opt)
    with torch.no_grad():
        for name, full in (saved.get("frozen_full") or {}).items():
            if name in params:
                params[name].ds_partitioner.load_full(params[name], full)
        if saved.get("partition_count") == opt.partition_count:
            for name, shard in (saved.get("frozen_shards") or {}).items():
                if name in params:
                    param = params[name]
                    param.ds_partitioner.fetch(param).copy_(shard)
                    param.ds_partitioner.settle(param)


def load_partition_state_dict(opt, saved, load_from_fp32_weights=None):
    """Install a ``partition_state_dict`` of this rank's *current* layout."""
    if load_from_fp32_weights is None:
        load_from_fp32_weights = bool(opt.zero_config.load_from_fp32_weights)
    if len(saved["single_partition_of_fp32_groups"]) != len(opt.chunks):
        raise ZeroCheckpointError(
            f"the checkpoint has {len(saved['single_partition_of_fp32_groups'])} optimizer param "
            f"groups, this optimizer has {len(opt.chunks)}")
    for group, chunks in enumerate(opt.chunks):
        flat = saved["single_partition_of_fp32_groups"][group]
        expected = opt.layouts[group].partition_numel
        if flat.numel() != expected:
            raise ZeroCheckpointError(f"param group {group}: the checkpoint partition holds "
                                      f"{flat.numel()} elements, this rank owns {expected}")
        start = 0
        for chunk in chunks:
            opt._swap_in(chunk)
            length = chunk.numel()
            state = {key: value.narrow(0, start, length).clone().to(chunk.device)
                     for key, value in saved["optimizer_state"][group].items()}
            for key, value in saved["optimizer_scalars"][group].items():
                state[key] = value.clone() if torch.is_tensor(value) else value
            opt.optimizer_for(chunk).state[chunk] = state
            if load_from_fp32_weights:
                with torch.no_grad():
                    chunk.copy_(flat.narrow(0, start, length))
            opt._swap_out(chunk)
            start += length
        opt.optimizer.param_groups[group].update(saved["param_groups"][group])
    _restore_frozen(opt, saved)
    if opt.loss_scaler is not None and saved.get("loss_scaler") is not None:
        opt.loss_scaler.load_state_dict(saved["loss_scaler"])
    opt.overflow = bool(saved.get("overflow", False))
    if load_from_fp32_weights:
        # the model's weights become the (rounded) fp32 partitions of every rank
        with torch.no_grad():
            for group, chunks in enumerate(opt.chunks):
                for chunk, segments in zip(chunks, opt._segments[group]):
                    opt._swap_in(chunk)
                    opt._write_back(chunk, segments)
                    opt._swap_out(chunk)
        opt.after_optimizer_step()
    else:
        opt.refresh_fp32_params()


def check_recut(opt, what):
    """Re-cutting assumes every param group is partitioned over the data-parallel group."""
    own = [index for index, comm in enumerate(getattr(opt, "group_comms", ()))
           if comm[0] is not opt.partition_group]
    if own:
        raise ZeroCheckpointError(
            f"cannot re-partition '{what}' for this run: optimizer param groups {own} are "
            f"partitioned over their own process groups (deepspeed.hooks.GRADIENT_GROUP, MoE "
            f"experts), which re-cutting ZeRO checkpoints does not support yet; load it with "
            f"the same data-parallel and expert-parallel layout and bucket sizes it was saved "
            f"with")
