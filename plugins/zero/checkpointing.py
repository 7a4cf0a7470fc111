"""ZeRO stage 1/2 optimizer checkpoints: one file per data-parallel rank, re-cut on demand.

Each rank writes ``zero_pp_rank_<dp rank>_mp_rank_<mp rank:02d>_optim_states.pt`` next to the
model states, holding its fp32 partition, its optimizer state in the same flat coordinates,
and the layout (``deepspeed.zero.partition.describe``) that says which element of which
parameter every partition element is. Loading under the same layout reads only this rank's
file; under another layout (a different bucket size, or, with ``elastic_checkpoint``, a
different number of ranks) every rank reads all files, rebuilds whole parameters and moments,
and cuts its new partition from them, so nothing is lost.
"""
import os

import torch

from deepspeed.checkpoint import atomic_torch_save, load_file
from deepspeed.version import __version__
from deepspeed.zero import partition as layout_math

OPTIM_FILE = "zero_pp_rank_{dp_rank}_mp_rank_{mp_rank:02d}_optim_states.pt"


class ZeroCheckpointError(RuntimeError):
    """A ZeRO checkpoint that cannot be loaded into this engine as configured."""


def optim_states_filename(dp_rank, mp_rank=0):
    return OPTIM_FILE.format(dp_rank=dp_rank, mp_rank=mp_rank)


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
            for key, value in opt.optimizer.state.get(chunk, {}).items():
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
        "zero_stage": opt.stage,
        "partition_count": opt.world_size,
        "layout": layout_math.describe(opt.layouts, opt.param_names),
        "single_partition_of_fp32_groups": fp32,
        "optimizer_state": states,
        "optimizer_scalars": scalars,
        "param_groups": hyper,
        "loss_scaler": opt.loss_scaler.state_dict() if opt.loss_scaler is not None else None,
        "overflow": bool(opt.overflow),
        "ds_version": str(__version__),
    }


def _frozen_zero3_params(opt):
    """ZeRO-3 parameters no optimizer partition covers (frozen ones): their shards are only
    on the ranks, so each rank's file carries its own."""
    owned = {id(p) for params in opt.partitioned_params for p in params}
    return {name: p for name, p in opt.module.named_parameters()
            if hasattr(p, "ds_id") and id(p) not in owned and not p.ds_persist}


def _frozen_shards(opt):
    out = {}
    for name, param in _frozen_zero3_params(opt).items():
        out[name] = param.ds_partitioner.fetch(param).detach().clone()
        param.ds_partitioner.settle(param)
    return out


def _restore_frozen(opt, saved):
    params = _frozen_zero3_params(opt)
    with torch.no_grad():
        for name, full in (saved.get("frozen_full") or {}).items():
            if name in params:
                params[name].ds_partitioner.load_full(params[name], full)
        if saved.get("partition_count") == opt.world_size:
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
            opt.optimizer.state[chunk] = state
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


# ---------------------------------------------------------------------- files
def save_rank_file(opt, checkpoint_dir, dp_rank, mp_rank, ds_config):
    path = os.path.join(checkpoint_dir, optim_states_filename(dp_rank, mp_rank))
    atomic_torch_save({"optimizer_state_dict": partition_state_dict(opt), "ds_config": ds_config,
                       "ds_version": str(__version__)}, path)
    return path


def _read(checkpoint_dir, dp_rank, mp_rank):
    path = os.path.join(checkpoint_dir, optim_states_filename(dp_rank, mp_rank))
    if not os.path.isfile(path):
        present = sorted(n for n in os.listdir(checkpoint_dir) if n.endswith("_optim_states.pt"))
        raise ZeroCheckpointError(f"ZeRO optimizer file '{path}' does not exist; "
                                  f"'{checkpoint_dir}' holds {present or 'no optimizer files'}")
    return load_file(path)["optimizer_state_dict"]


def load_rank_file(opt, checkpoint_dir, dp_rank, mp_rank, elastic, saved_world=None):
    """Restore ``opt`` from the checkpoint's ZeRO files, re-cutting partitions when needed.
    ``saved_world`` (the model states' ``dp_world_size``) saves opening rank 0's file.
    With ``"checkpoint": {"load_universal": true}`` the folder is a universal checkpoint
    (``ds_to_universal``), cut for this layout by ``deepspeed.zero.universal``."""
    from deepspeed.checkpoint.universal import is_universal_checkpoint

    if bool(getattr(opt.config, "load_universal_checkpoint", False)):
        from deepspeed.zero.universal import load_universal_checkpoint

        load_universal_checkpoint(opt, checkpoint_dir)
        return
    if is_universal_checkpoint(checkpoint_dir):
        raise ZeroCheckpointError(
            f"'{checkpoint_dir}' is a universal checkpoint (written by ds_to_universal); set "
            f"\"checkpoint\": {{\"load_universal\": true}} in the config to load it")
    if saved_world is None:
        saved_world = int(_read(checkpoint_dir, 0, mp_rank)["partition_count"])
    if saved_world != opt.world_size and not elastic:
        raise ZeroCheckpointError(
            f"the ZeRO checkpoint in '{checkpoint_dir}' was saved with {saved_world} "
            f"data-parallel ranks and this run has {opt.world_size}; set "
            f"\"zero_optimization\": {{\"elastic_checkpoint\": true}} to re-partition it")
    my_layout = layout_math.describe(opt.layouts, opt.param_names)
    if saved_world == opt.world_size:
        mine = _read(checkpoint_dir, dp_rank, mp_rank)
        if mine["layout"] == my_layout:
            load_partition_state_dict(opt, mine)
            return
    files = [_read(checkpoint_dir, r, mp_rank) for r in range(saved_world)]
    load_partition_state_dict(opt, reshape(files, my_layout, opt.world_size, opt.rank))


def reshape(files, new_layout, world_size, rank):
    """A ``partition_state_dict`` for ``rank`` of ``world_size`` under ``new_layout``, built
    from every old rank's state dict (``files`` in old rank order)."""
    old_layout = files[0]["layout"]
    if len(old_layout) != len(new_layout):
        raise ZeroCheckpointError(f"the checkpoint has {len(old_layout)} optimizer param groups, "
                                  f"this optimizer has {len(new_layout)}")
    fp32, states = [], []
    for group, (old, new) in enumerate(zip(old_layout, new_layout)):
        numels = {n: k for b in old for n, k in zip(b["params"], b["numels"])}
        wanted = {n: k for b in new for n, k in zip(b["params"], b["numels"])}
        if numels != wanted:
            raise ZeroCheckpointError(
                f"param group {group}: the checkpoint's parameters "
                f"{sorted(set(numels) ^ set(wanted))[:10]} differ from this model's (names or "
                f"sizes); the model must have the same trainable parameters")

        def recut(partitions):
            whole = layout_math.assemble(old, partitions, numels)
            return layout_math.split(new, world_size, rank, whole, dtype=partitions[0].dtype)

        fp32.append(recut([f["single_partition_of_fp32_groups"][group] for f in files]))
        states.append({key: recut([f["optimizer_state"][group][key] for f in files])
                       for key in files[0]["optimizer_state"][group]})
    frozen = {}
    for name in files[0].get("frozen_shards") or {}:
        frozen[name] = torch.cat([f["frozen_shards"][name].reshape(-1) for f in files])
    out = dict(files[0])
    out.update(partition_count=world_size, layout=new_layout, frozen_shards=None,
               frozen_full=frozen, single_partition_of_fp32_groups=fp32, optimizer_state=states)
    return out
