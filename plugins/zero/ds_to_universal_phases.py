"""The two phases of ``ds_to_universal`` and the writing of its output, shared by the conversion
of a plain ZeRO checkpoint (``deepspeed.zero.ds_to_universal``) and of a pipeline one
(``deepspeed.zero.ds_to_universal_pipeline``):

* reading the source: one model-parallel rank's ZeRO rank files, checked complete
  (``rank_world``), and the shapes its model states record (``param_shapes``);
* phase 1, *extract* (``extract_rank``, one job per source rank): the rank's flat partitions cut
  into per-parameter fragments ``<temp>/<param>/<rank>.pt``;
* phase 2, *merge* (``merge_param``, one job per parameter, built by ``merge_jobs``): the
  fragments of all ranks put together into full-shape tensors;
* assembling: the groups and frozen shapes of the layout, checked against the model states;
* writing: the info dict (``universal_info``), model states, RNG files and ``latest`` pointers
  (``finish``).
"""
import os
import shutil
from collections import OrderedDict

import torch

from deepspeed.checkpoint import universal
from deepspeed.checkpoint.atomic import (CheckpointFormatError, atomic_torch_save,
                                         atomic_write_text, load_file)
from deepspeed.checkpoint.layout import LATEST_FILENAME, model_states_filename
from deepspeed.utils.progress import progress
from deepspeed.zero.checkpoint_layout import partition_numel, partition_ranges
from deepspeed.zero.checkpointing import optim_states_filename

OPTIM_SUFFIX = "_optim_states.pt"
TEMP_DIRNAME = "tmp"


def optim_file(checkpoint_dir, rank, mp_rank=0):
    return os.path.join(checkpoint_dir, optim_states_filename(rank, mp_rank))


def load_cpu(path):
    return torch.load(path, map_location="cpu", weights_only=True, mmap=True)


def saved_loss_scaler(checkpoint_dir, mp_rank=0):
    """The loss scaler state rank 0 (of model-parallel rank ``mp_rank``) saved, or ``None``."""
    return load_cpu(optim_file(checkpoint_dir, 0, mp_rank))["optimizer_state_dict"].get(
        "loss_scaler")


# ---------------------------------------------------------------------- source reading
def rank_world(checkpoint_dir, strict, mp_rank=None):
    """The data-parallel world size of the ZeRO files of model-parallel rank ``mp_rank`` (a
    pipeline stage); ``None``: the checkpoint must have model-parallel size 1."""
    names = sorted(n for n in os.listdir(checkpoint_dir) if n.endswith(OPTIM_SUFFIX))
    if not names:
        raise CheckpointFormatError(f"'{checkpoint_dir}' holds no ZeRO optimizer files "
                                    f"(*{OPTIM_SUFFIX}); only ZeRO stage 1-3 checkpoints and "
                                    f"pipeline checkpoints (with or without ZeRO) convert")
    if mp_rank is None:
        if any("_mp_rank_00" not in n for n in names):
            raise CheckpointFormatError(
                f"'{checkpoint_dir}' has tensor/model-parallel ranks > 0 ({names[:4]}...) but "
                f"is not a pipeline checkpoint; only model-parallel size 1 and pipeline "
                f"checkpoints (one model-parallel rank per stage) convert")
        mp_rank = 0
    names = [n for n in names if f"_mp_rank_{mp_rank:02d}_" in n]
    if not names:
        raise CheckpointFormatError(f"'{checkpoint_dir}' holds no ZeRO optimizer files of "
                                    f"model-parallel rank (pipeline stage) {mp_rank}")
    world = int(load_cpu(optim_file(checkpoint_dir, 0, mp_rank))["optimizer_state_dict"][
        "partition_count"])
    expected = {os.path.basename(optim_file(checkpoint_dir, r, mp_rank)) for r in range(world)}
    missing, extra = sorted(expected - set(names)), sorted(set(names) - expected)
    if missing:
        raise CheckpointFormatError(f"'{checkpoint_dir}' was saved by {world} ranks but lacks "
                                    f"{missing}")
    if extra and strict:
        raise CheckpointFormatError(f"'{checkpoint_dir}' holds {extra}, beyond the {world} ranks "
                                    f"its files name (--no_strict ignores them)")
    return world


def param_shapes(model_states, inject_missing_state):
    """``[OrderedDict(name -> shape)]`` per group, from the model states (or, with
    ``inject_missing_state``, from the module's whole weights when the file lacks them)."""
    shapes = model_states.get("param_shapes")
    if shapes:
        return [OrderedDict((n, list(s)) for n, s in group.items()) for group in shapes]
    if not inject_missing_state:
        raise CheckpointFormatError("the model-states file has no 'param_shapes'; pass "
                                    "--inject_missing_state to take shapes from its module weights")
    return None


def _summary(state):
    return {"layout": state["layout"], "zero_stage": state["zero_stage"],
            "param_groups": state["param_groups"], "optimizer_scalars": state["optimizer_scalars"],
            "state_keys": [sorted(g) for g in state["optimizer_state"]],
            "frozen": sorted(state.get("frozen_shards") or {})}


def extract_rank(job):
    """Phase 1 for one source rank: one fragment file per parameter it holds a slice of."""
    # mp_rank: a pipeline stage; moe: ``ds_to_universal_moe.moe_plan`` (an MoE checkpoint)
    checkpoint_dir, rank, world, temp_dir, *rest = job
    mp_rank, moe = rest[:1], (rest[1] if len(rest) > 1 else None)
    state = load_cpu(optim_file(checkpoint_dir, rank, *mp_rank))["optimizer_state_dict"]
    for group, described in enumerate(state["layout"]):
        flat = state["single_partition_of_fp32_groups"][group]
        moments = state["optimizer_state"][group]
        group_world, group_rank, rename, (where, file_id) = world, rank, None, (temp_dir, rank)
        if moe:  # expert groups: partitioned over their expert-data-parallel group
            from deepspeed.zero.ds_to_universal_moe_plan import fragment_place, group_placement

            group_world, group_rank, rename = group_placement(moe, described, world, rank)
            where, file_id = fragment_place(moe, described, rank, temp_dir)
        if partition_numel(described, group_world) != flat.numel():
            raise CheckpointFormatError(
                f"rank {rank}'s optimizer file holds {flat.numel()} elements of param group "
                f"{group}, its layout {partition_numel(described, group_world)} over "
                f"{group_world} ranks: the group was partitioned over another process group")
        for name, start, stop, at in partition_ranges(described, group_world, group_rank):
            name = rename(name) if rename else name
            n = stop - start
            fragment = {"start": start, "stop": stop, universal.FP32_KEY: flat[at:at + n].clone()}
            fragment.update({k: v[at:at + n].clone() for k, v in moments.items()})
            target = os.path.join(where, name)
            os.makedirs(target, exist_ok=True)
            atomic_torch_save(fragment, os.path.join(target, f"{file_id}.pt"), check=False)
    for name, shard in (state.get("frozen_shards") or {}).items():
        target = os.path.join(temp_dir, name)
        os.makedirs(target, exist_ok=True)
        atomic_torch_save({"start": None, "stop": None, universal.FP32_KEY: shard.clone()},
                          os.path.join(target, f"{rank}.pt"), check=False)
    return _summary(state)


def merge_param(job):
    """Phase 2 for one parameter: full-shape tensors from every rank's fragment."""
    name, shape, keys, world, temp_dir, out_dir, frozen = job
    numel = 1
    for size in shape:
        numel *= int(size)
    fragments = [(r, os.path.join(temp_dir, name, f"{r}.pt")) for r in range(world)]
    fragments = [(r, load_file(p)) for r, p in fragments if os.path.isfile(p)]
    full, covered = {}, 0
    if frozen:  # ZeRO-3 shards, padded at the end: rank order is element order
        flat = torch.cat([f[universal.FP32_KEY].reshape(-1) for _, f in fragments])
        covered = min(flat.numel(), numel)
        full[universal.FP32_KEY] = flat[:numel].clone()
    else:
        for _, fragment in fragments:
            start, stop = fragment["start"], fragment["stop"]
            covered += stop - start
            for key in keys:
                if key not in full:
                    full[key] = torch.zeros(numel, dtype=fragment[key].dtype)
                full[key][start:stop] = fragment[key]
    if covered != numel or not full:
        raise CheckpointFormatError(f"parameter {name!r}: the rank files cover {covered} of "
                                    f"its {numel} elements {tuple(shape)}; the checkpoint is "
                                    f"incomplete")
    for key, tensor in full.items():
        path = universal.param_file(out_dir, name, key)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        atomic_torch_save({"param": tensor.reshape(shape)}, path)
    return name


def pool_map(fn, jobs, workers, desc=None):
    """``map`` in this process for one worker (no start-up cost), else over a process pool;
    results come back in job order either way. ``desc`` names the progress bar drawn on a
    terminal (one tick per finished job)."""
    if workers <= 1 or len(jobs) <= 1:
        return [fn(job) for job in progress(jobs, desc=desc, unit="job")]
    import multiprocessing

    methods = multiprocessing.get_all_start_methods()
    context = multiprocessing.get_context("fork" if "fork" in methods else "spawn")
    with context.Pool(min(workers, len(jobs))) as pool:
        return list(progress(pool.imap(fn, jobs, chunksize=1), total=len(jobs), desc=desc,
                             unit="job"))


# ---------------------------------------------------------------------- assembling
def check_ranks_agree(summaries, strict):
    first = summaries[0]
    for rank, summary in enumerate(summaries[1:], start=1):
        for key in ("layout", "zero_stage", "state_keys", "frozen"):
            if summary[key] != first[key]:
                raise CheckpointFormatError(f"rank {rank}'s optimizer file disagrees with rank "
                                            f"0's on {key!r}: the files are from different saves")
        if strict and summary["optimizer_scalars"] != first["optimizer_scalars"]:
            raise CheckpointFormatError(
                f"rank {rank}'s optimizer scalars {summary['optimizer_scalars']} differ from rank "
                f"0's {first['optimizer_scalars']} (--no_strict keeps rank 0's)")


def layout_groups(summary, shapes, model_states):
    """Per group, ``OrderedDict(name -> shape)`` of the parameters the layout holds, checked
    against the model states' shapes."""
    module = model_states.get("module") or {}
    known = {n: s for g in shapes for n, s in g.items()} if shapes is not None else None
    groups = []
    for described in summary["layout"]:
        group = OrderedDict()
        for bucket in described:
            for name, numel in zip(bucket["params"], bucket["numels"]):
                if known is not None:
                    if name not in known:
                        raise CheckpointFormatError(f"parameter {name!r} of the optimizer "
                                                    f"layout is missing from 'param_shapes'")
                    shape = known[name]
                else:
                    weight = module.get(name)
                    if weight is None or weight.numel() != numel:
                        raise CheckpointFormatError(
                            f"cannot infer the shape of {name!r}: the module weights hold "
                            f"{None if weight is None else tuple(weight.shape)} for {numel} "
                            f"elements (ZeRO-3 placeholders are empty)")
                    shape = list(weight.shape)
                if int(torch.Size(shape).numel()) != int(numel):
                    raise CheckpointFormatError(f"parameter {name!r}: shape {tuple(shape)} does "
                                                f"not hold the layout's {numel} elements")
                group[name] = list(shape)
        groups.append(group)
    return groups


def checked_groups(summary, shapes, model_states, strict, where=""):
    """``layout_groups``; with ``strict``, also checked to name exactly the parameters
    ``param_shapes`` records (``where`` prefixes the error, e.g. ``"pipeline stage 1: "``)."""
    groups = layout_groups(summary, shapes, model_states)
    if strict and shapes is not None:
        recorded = {n for g in shapes for n in g}
        converted = {n for g in groups for n in g}
        if recorded != converted:
            raise CheckpointFormatError(
                f"{where}'param_shapes' and the optimizer layout disagree on "
                f"{sorted(recorded ^ converted)[:10]} (--no_strict converts the layout's)")
    return groups


def merge_jobs(groups, state_keys, sharded_frozen, world, temp_dir, out_dir):
    """``OrderedDict(name -> merge_param job)``: every trained parameter of ``groups`` (its
    group's ``state_keys`` and the fp32 weight), then every sharded frozen one (fp32 only)."""
    jobs = OrderedDict()
    for group, keys in zip(groups, state_keys):
        for name, shape in group.items():
            jobs[name] = (name, shape, sorted(set(keys) | {universal.FP32_KEY}), world, temp_dir,
                          out_dir, False)
    for name, shape in sharded_frozen.items():
        jobs[name] = (name, shape, [universal.FP32_KEY], world, temp_dir, out_dir, True)
    return jobs


def frozen_shapes(model_states, frozen_names):
    recorded = model_states.get("frozen_param_shapes") or {}
    out = OrderedDict()
    for name in frozen_names:
        shape = list(recorded.get(name, []))
        if not shape or torch.Size(shape).numel() == 0:
            raise CheckpointFormatError(
                f"the ZeRO-3 frozen parameter {name!r} has no recorded full shape in "
                f"'frozen_param_shapes' ({recorded.get(name)}); the checkpoint was written "
                f"without it and cannot be re-assembled")
        out[name] = shape
    return out


def write_module_frozen(model_states, out_dir, sharded):
    """Frozen parameters the module weights hold whole (stages 1/2, persistent ZeRO-3 ones):
    stored like the sharded ones, so every frozen parameter has a ``fp32.pt``."""
    module = model_states.get("module") or {}
    written = OrderedDict()
    for name, shape in (model_states.get("frozen_param_shapes") or {}).items():
        weight = module.get(name)
        if name in sharded or weight is None or weight.numel() == 0:
            continue
        path = universal.param_file(out_dir, name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        atomic_torch_save({"param": weight.float().clone()}, path)
        written[name] = list(shape)
    return written


# ---------------------------------------------------------------------- writing
def fresh_dirs(out_dir, temp_dir):
    os.makedirs(out_dir, exist_ok=True)
    shutil.rmtree(temp_dir, ignore_errors=True)
    os.makedirs(temp_dir)


def universal_info(tag, source, groups, frozen, state_keys, scalars, hyper, scaler):
    """The info file's dict (``deepspeed.checkpoint.universal`` reads it)."""
    return {
        "format": universal.FORMAT, "format_version": universal.FORMAT_VERSION, "tag": tag,
        "source": source,
        "group_params": [list(g) for g in groups],
        "param_shapes": {n: s for g in groups for n, s in g.items()},
        "frozen_param_shapes": dict(frozen),
        "state_keys": state_keys,
        "optimizer_scalars": scalars,
        "param_groups": hyper,
        "loss_scaler": scaler,
    }


def finish(checkpoint_dir, output_folder, tag, info, model_states, keep_temp_folder):
    """The model states, RNG states and info file, then the ``latest*`` pointers."""
    out_dir = os.path.join(output_folder, tag)
    atomic_torch_save(model_states, os.path.join(out_dir, model_states_filename(0)))
    for name in sorted(os.listdir(checkpoint_dir)):
        if name.startswith("rng_state_rank_") and name.endswith(".pt"):
            atomic_torch_save(load_file(os.path.join(checkpoint_dir, name)),
                              os.path.join(out_dir, name))
    # the info file is written after every tensor: its presence marks a finished conversion
    atomic_torch_save(info, os.path.join(out_dir, universal.INFO_FILENAME))
    if not keep_temp_folder:
        shutil.rmtree(os.path.join(output_folder, TEMP_DIRNAME))
    atomic_write_text(os.path.join(output_folder, universal.LATEST_UNIVERSAL_FILENAME), tag)
    atomic_write_text(os.path.join(output_folder, LATEST_FILENAME), tag)
    return out_dir

