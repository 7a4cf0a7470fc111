"""``ds_to_universal``: convert one ZeRO checkpoint tag into a universal checkpoint.

    ds_to_universal --input_folder <save_dir or save_dir/tag> --output_folder <dir>
                    [--num_extract_workers N] [--num_merge_workers N] [--keep_temp_folder]
                    [--strict | --no_strict] [--inject_missing_state]

(also ``python -m deepspeed.checkpoint.ds_to_universal``, upstream's path, which setup.py maps
onto this module through ``plugins/zero/upstream_paths``; ``convert(...)`` from Python.) The
output layout is described in ``deepspeed.checkpoint.universal``. It lives in the ZeRO plugin
because reading the source is reading ZeRO's partition files and layout.

Two phases, each a process pool, so no process ever holds more than one rank file or one
parameter's fragments:

1. *extract* (per source rank): cut the rank's flat partitions into per-parameter fragments
   ``<output>/tmp/<param>/<rank>.pt`` (with their element offsets);
2. *merge* (per parameter): put the fragments of all ranks together into full-shape tensors.

Every file is a pure function of the input, so the output does not depend on the worker counts.

Pipeline checkpoints (``pipeline_stages`` in the model-states files: one ``mp_rank_<stage>``
model-states file per stage, the layers in ``layer_XX-model_states.pt``, and with ZeRO inside
the stages one set of ``zero_pp_rank_<dp>_mp_rank_<stage>`` files per stage) convert too, with
or without ZeRO: each stage is read like a checkpoint of its own (without ZeRO, from the torch
optimizer state in its model-states file) and the stages are merged under the PipelineModule's
global names, a tied weight once, the param groups merged group by group. The result is what a
single-stage model with those names would have saved (``source.pipeline_stages`` records the
origin): it loads with ``load_universal`` into any non-pipeline engine whose ``state_dict``
names are the pipeline's global names (an ``nn.Sequential`` of the same layers), at any
data-parallel size and ZeRO stage 0-3. Loading it into a ``PipelineEngine`` is not supported
(each stage would have to take its own parameters by name); a pipeline resumes from its own
checkpoint, at its own shape. Tensor-parallel ranks inside stages are refused.
"""
import argparse
import os
import re
import shutil
import sys
from collections import OrderedDict

import torch

from deepspeed.checkpoint import universal
from deepspeed.checkpoint.atomic import (CheckpointFormatError, atomic_torch_save,
                                         atomic_write_text, load_file)
from deepspeed.checkpoint.layout import LATEST_FILENAME, model_states_filename, read_latest
from deepspeed.zero import zero_to_fp32 as fp32_script
from deepspeed.zero.checkpoint_layout import partition_ranges
from deepspeed.zero.checkpointing import optim_states_filename

OPTIM_SUFFIX = "_optim_states.pt"
TEMP_DIRNAME = "tmp"


def optim_file(checkpoint_dir, rank, mp_rank=0):
    return os.path.join(checkpoint_dir, optim_states_filename(rank, mp_rank))


def _load(path):
    return torch.load(path, map_location="cpu", weights_only=True, mmap=True)


def resolve_input(input_folder):
    """``(checkpoint_dir, tag)`` for a save dir (its ``latest`` tag) or a tag folder."""
    input_folder = os.path.abspath(os.fspath(input_folder))
    if os.path.isfile(os.path.join(input_folder, model_states_filename(0))):
        return input_folder, os.path.basename(input_folder.rstrip(os.sep))
    if not os.path.isdir(input_folder):
        raise FileNotFoundError(f"--input_folder '{input_folder}' does not exist")
    tag = read_latest(input_folder)
    if tag is None:
        raise FileNotFoundError(
            f"--input_folder '{input_folder}' is neither a checkpoint tag folder (no "
            f"{model_states_filename(0)}) nor a save dir with a '{LATEST_FILENAME}' file; pass "
            f"the tag folder, one of {sorted(os.listdir(input_folder))[:10]}")
    path = os.path.join(input_folder, tag)
    if not os.path.isfile(os.path.join(path, model_states_filename(0))):
        raise FileNotFoundError(f"'{input_folder}/{LATEST_FILENAME}' names tag '{tag}', but "
                                f"'{path}' holds no {model_states_filename(0)}")
    return path, tag


# ---------------------------------------------------------------------- source reading
def _rank_files(checkpoint_dir, strict, mp_rank=None):
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
    world = int(_load(optim_file(checkpoint_dir, 0, mp_rank))["optimizer_state_dict"][
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


def _param_shapes(model_states, inject_missing_state):
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


def _extract_rank(job):
    """Phase 1 for one source rank: one fragment file per parameter it holds a slice of."""
    checkpoint_dir, rank, world, temp_dir, *mp_rank = job  # mp_rank: a pipeline stage
    state = _load(optim_file(checkpoint_dir, rank, *mp_rank))["optimizer_state_dict"]
    for group, described in enumerate(state["layout"]):
        flat = state["single_partition_of_fp32_groups"][group]
        moments = state["optimizer_state"][group]
        for name, start, stop, at in partition_ranges(described, world, rank):
            n = stop - start
            fragment = {"start": start, "stop": stop, universal.FP32_KEY: flat[at:at + n].clone()}
            fragment.update({k: v[at:at + n].clone() for k, v in moments.items()})
            target = os.path.join(temp_dir, name)
            os.makedirs(target, exist_ok=True)
            atomic_torch_save(fragment, os.path.join(target, f"{rank}.pt"), check=False)
    for name, shard in (state.get("frozen_shards") or {}).items():
        target = os.path.join(temp_dir, name)
        os.makedirs(target, exist_ok=True)
        atomic_torch_save({"start": None, "stop": None, universal.FP32_KEY: shard.clone()},
                          os.path.join(target, f"{rank}.pt"), check=False)
    return _summary(state)


def _merge_param(job):
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


def _pool_map(fn, jobs, workers):
    """``map`` in this process for one worker (no start-up cost), else over a process pool;
    results come back in job order either way."""
    if workers <= 1 or len(jobs) <= 1:
        return [fn(job) for job in jobs]
    import multiprocessing

    methods = multiprocessing.get_all_start_methods()
    context = multiprocessing.get_context("fork" if "fork" in methods else "spawn")
    with context.Pool(min(workers, len(jobs))) as pool:
        return pool.map(fn, jobs, chunksize=1)


# ---------------------------------------------------------------------- assembling
def _check_ranks_agree(summaries, strict):
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


def _groups(summary, shapes, model_states):
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


def _frozen_shapes(model_states, frozen_names):
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


def _write_module_frozen(model_states, out_dir, sharded):
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


def _whole_module(model_states, out_dir, groups, frozen):
    """The model states with each empty ZeRO-3 placeholder in ``module`` replaced by the whole
    weight, so any stage (and plain PyTorch) can load the module."""
    module = OrderedDict(model_states.get("module") or {})
    names = {n: s for g in groups for n, s in g.items()}
    names.update(frozen)
    shared = model_states.get("shared_params") or {}
    for key, value in list(module.items()):
        source = shared.get(key, key)
        if source in names and value.numel() != torch.Size(names[source]).numel():
            whole = universal.load_param_state(out_dir, source, mmap=False)
            module[key] = whole.to(value.dtype).clone()
    state = dict(model_states)
    state["module"] = module
    return state


# ---------------------------------------------------------------------- pipelines
# A pipeline checkpoint (``pipeline_stages`` in its model-states files) has one model-states
# file per stage (``mp_rank_<stage>``, module None: the layers are in ``layer_XX-model_states.pt``
# under their global index) and, with ZeRO inside the stages, one set of rank files per stage.
# Each stage is read on its own, as ``zero_to_fp32`` does, and the results merged under the
# PipelineModule's global names (``3.weight``, ``tied_modules.<key>.weight``; a tied weight,
# held by every stage using it, is taken once, from the first): the universal checkpoint is
# then the one a single-stage model with those names would have produced.
_LAYER_FILE_RE = re.compile(r"^layer_(\d+)-model_states\.pt$")


def _same(a, b):
    try:
        return bool(a == b)
    except (RuntimeError, TypeError):  # tensors of several elements
        return repr(a) == repr(b)


def _stage_states(checkpoint_dir, stage, stages, first):
    """Stage ``stage``'s model states, ``module`` filled from the layer files (global names:
    the stage's trained, frozen and buffer entries; tied modules' weights are not there)."""
    if stage == 0:
        states = first
    else:
        path = os.path.join(checkpoint_dir, model_states_filename(stage))
        if not os.path.isfile(path):
            raise CheckpointFormatError(f"'{checkpoint_dir}' is a checkpoint of {stages} "
                                        f"pipeline stages but lacks {os.path.basename(path)}")
        states = load_file(path)
    states = dict(states)
    if states.get("module") is None:
        states["module"] = fp32_script._pipeline_layer_entries(checkpoint_dir, states)
    return states


def _zero_stage_parts(checkpoint_dir, all_states, temp_dir, workers, strict, inject):
    """Per stage: its groups, state keys, scalars, hyperparameters and merge jobs, after
    extracting every (stage, data-parallel rank) file's fragments into ``tmp/stage_XX``."""
    worlds = [_rank_files(checkpoint_dir, strict, mp_rank=s) for s in range(len(all_states))]
    temps = [os.path.join(temp_dir, f"stage_{s:02d}") for s in range(len(all_states))]
    summaries = _pool_map(_extract_rank, [(checkpoint_dir, r, worlds[s], temps[s], s)
                                          for s in range(len(all_states))
                                          for r in range(worlds[s])], workers)
    parts = []
    for stage, states in enumerate(all_states):
        mine, summaries = summaries[:worlds[stage]], summaries[worlds[stage]:]
        _check_ranks_agree(mine, strict)
        first = mine[0]
        shapes = _param_shapes(states, inject)
        groups = _groups(first, shapes, states)
        if strict and shapes is not None:
            recorded = {n for g in shapes for n in g}
            converted = {n for g in groups for n in g}
            if recorded != converted:
                raise CheckpointFormatError(
                    f"pipeline stage {stage}: 'param_shapes' and the optimizer layout disagree "
                    f"on {sorted(recorded ^ converted)[:10]} (--no_strict converts the layout's)")
        sharded = _frozen_shapes(states, first["frozen"])
        jobs = {}
        for group, keys in zip(groups, first["state_keys"]):
            for name, shape in group.items():
                jobs[name] = (name, shape, sorted(set(keys) | {universal.FP32_KEY}),
                              worlds[stage], temps[stage], None, False)
        for name, shape in sharded.items():
            jobs[name] = (name, shape, [universal.FP32_KEY], worlds[stage], temps[stage], None,
                          True)
        parts.append({"groups": groups, "state_keys": first["state_keys"],
                      "scalars": first["optimizer_scalars"], "hyper": first["param_groups"],
                      "zero_stage": int(first["zero_stage"]), "dp_world_size": worlds[stage],
                      "sharded_frozen": sharded, "jobs": jobs})
    loss_scaler = _load(optim_file(checkpoint_dir, 0, 0))["optimizer_state_dict"].get(
        "loss_scaler")
    return parts, loss_scaler


def _claimed_layers(all_states):
    """Global layer indices some stage names an entry of (``<idx>.<key>``)."""
    names = set()
    for states in all_states:
        names |= {n for g in states.get("param_shapes") or [] for n in g}
        names |= set(states.get("buffer_names") or ())
        names |= set((states.get("frozen_param_shapes") or {}).keys())
    return {int(n.split(".", 1)[0]) for n in names if n.split(".", 1)[0].isdigit()}


def _tied_weight(checkpoint_dir, name, shape, claimed):
    """The weight of a tied module without ZeRO or fp32 masters: only the layer file of a layer
    that is the tied module (an index no global name claims) holds it, under its local key."""
    parts = name.split(".", 2)
    if len(parts) != 3 or parts[0] != "tied_modules":
        raise CheckpointFormatError(f"parameter {name!r} is in no layer file of the pipeline "
                                    f"checkpoint '{checkpoint_dir}'")
    found = []
    for file in sorted(os.listdir(checkpoint_dir)):
        match = _LAYER_FILE_RE.match(file)
        if match is None or int(match.group(1)) in claimed:
            continue
        value = load_file(os.path.join(checkpoint_dir, file)).get(parts[2])
        if torch.is_tensor(value) and list(value.shape) == list(shape) and \
                not any(torch.equal(value, f) for f in found):
            found.append(value)
    if len(found) != 1:
        raise CheckpointFormatError(
            f"tied parameter {name!r}: {len(found)} different candidate weights "
            f"'{parts[2]}' {tuple(shape)} in the layer files of '{checkpoint_dir}'; cannot tell "
            f"which layer file holds it")
    return found[0]


def _torch_stage_part(checkpoint_dir, states, stage, claimed):
    """One stage's part without ZeRO: the optimizer state the stage's model-states file holds
    (a torch ``state_dict``, or the mixed-precision wrapper's with its fp32 master weights),
    mapped to names through ``param_shapes`` (one entry per optimizer param, group order)."""
    saved = states.get("optimizer")
    if not isinstance(saved, dict):
        raise CheckpointFormatError(
            f"pipeline stage {stage}: the model states hold no optimizer state and there are "
            f"no ZeRO optimizer files; only checkpoints saved with an optimizer convert")
    masters, loss_scaler = None, None
    if "optimizer_state_dict" in saved:  # fp16/bf16: the wrapper's state and fp32 masters
        masters, loss_scaler = saved.get("fp32_master_weights"), saved.get("loss_scaler")
        saved = saved["optimizer_state_dict"]
    if "state" not in saved or "param_groups" not in saved:
        raise CheckpointFormatError(f"pipeline stage {stage}: the optimizer state has keys "
                                    f"{sorted(saved)[:8]}, not a torch optimizer state_dict's")
    shapes = states.get("param_shapes") or []
    counts = [len(g["params"]) for g in saved["param_groups"]]
    if [len(g) for g in shapes] != counts:
        raise CheckpointFormatError(
            f"pipeline stage {stage}: 'param_shapes' names {[len(g) for g in shapes]} "
            f"parameters per group, the optimizer holds {counts}; cannot tell which state "
            f"belongs to which parameter")
    module = states.get("module") or {}
    groups, keys_per_group, scalars_per_group, tensors = [], [], [], OrderedDict()
    position = 0
    for group_shapes, group in zip(shapes, saved["param_groups"]):
        names = OrderedDict((n, list(s)) for n, s in group_shapes.items())
        keys, scalars = None, None
        for name, index in zip(names, group["params"]):
            shape = names[name]
            numel = int(torch.Size(shape).numel())
            state = saved["state"].get(index, {})
            elementwise = {k: v for k, v in state.items()
                           if torch.is_tensor(v) and v.dim() > 0 and v.numel() == numel}
            others = {k: v for k, v in state.items() if k not in elementwise}
            if keys is None:
                keys, scalars = sorted(elementwise), others
            elif sorted(elementwise) != keys or not _same(others, scalars):
                raise CheckpointFormatError(
                    f"pipeline stage {stage}: parameter {name!r} has optimizer state "
                    f"{sorted(state)} unlike its group's first ({keys} and {sorted(scalars)})")
            if masters is not None:
                weight = masters[position]
            elif name in module:
                weight = module[name]
            else:
                weight = _tied_weight(checkpoint_dir, name, shape, claimed)
            position += 1
            tensors[name] = {universal.FP32_KEY: weight.float().reshape(shape),
                             **{k: v.reshape(shape) for k, v in elementwise.items()}}
        groups.append(names)
        keys_per_group.append(keys or [])
        scalars_per_group.append(scalars or {})
    hyper = [{k: v for k, v in g.items() if k != "params"} for g in saved["param_groups"]]
    return {"groups": groups, "state_keys": keys_per_group, "scalars": scalars_per_group,
            "hyper": hyper, "zero_stage": 0, "dp_world_size": int(states.get("dp_world_size", 1)),
            "sharded_frozen": {}, "tensors": tensors}, loss_scaler


def _merge_stages(parts, strict):
    """The stages' groups merged group by group (a single-stage model's groups), with the
    first stage's state keys, scalars and hyperparameters, checked against the others'."""
    count = len(parts[0]["groups"])
    merged = [OrderedDict() for _ in range(count)]
    owner = {}
    for stage, part in enumerate(parts):
        if len(part["groups"]) != count:
            raise CheckpointFormatError(
                f"pipeline stage {stage} has {len(part['groups'])} optimizer param groups, "
                f"stage 0 has {count}: the stages must be built with the same groups")
        for index, group in enumerate(part["groups"]):
            for name, shape in group.items():
                if name in owner:  # a tied weight: the first stage holding it provides it
                    if list(shape) != list(merged[index].get(name, shape)) or \
                            name not in merged[index]:
                        raise CheckpointFormatError(
                            f"parameter {name!r} is held by several pipeline stages in "
                            f"different optimizer groups or shapes")
                    continue
                owner[name] = stage
                merged[index][name] = list(shape)
    first = {"state_keys": None, "scalars": None, "hyper": None}
    for index in range(count):
        holders = [p for p in parts if p["groups"][index]]
        reference = holders[0] if holders else parts[0]
        for key in first:
            if first[key] is None:
                first[key] = []
            first[key].append(reference[key][index])
        for stage, part in enumerate(parts):
            if part is reference or not part["groups"][index]:
                continue
            if part["state_keys"][index] != reference["state_keys"][index]:
                raise CheckpointFormatError(
                    f"optimizer group {index}: pipeline stage {stage} keeps state "
                    f"{part['state_keys'][index]}, another stage "
                    f"{reference['state_keys'][index]}")
            for key, what in (("scalars", "optimizer scalars"), ("hyper", "hyperparameters")):
                if strict and not _same(part[key][index], reference[key][index]):
                    raise CheckpointFormatError(
                        f"optimizer group {index}: pipeline stage {stage}'s {what} "
                        f"{part[key][index]} differ from another stage's "
                        f"{reference[key][index]} (--no_strict keeps the first stage's)")
    return merged, owner, first


def _convert_pipeline(checkpoint_dir, tag, output_folder, first_states, extract_workers,
                      merge_workers, keep_temp_folder, strict, inject_missing_state):
    stages = int(first_states[fp32_script.PIPELINE_STAGES])
    out_dir = os.path.join(output_folder, tag)
    temp_dir = os.path.join(output_folder, TEMP_DIRNAME)
    mp_ranks = fp32_script._mp_ranks(checkpoint_dir)
    if mp_ranks and mp_ranks != list(range(stages)):
        raise CheckpointFormatError(
            f"'{checkpoint_dir}' holds ZeRO files of model-parallel ranks {mp_ranks} for "
            f"{stages} pipeline stages; only pipelines without tensor parallelism (one "
            f"model-parallel rank per stage) convert")
    all_states = [_stage_states(checkpoint_dir, s, stages, first_states) for s in range(stages)]
    _fresh_dirs(out_dir, temp_dir)
    if mp_ranks:
        parts, loss_scaler = _zero_stage_parts(checkpoint_dir, all_states, temp_dir,
                                               extract_workers, strict, inject_missing_state)
    else:
        claimed = _claimed_layers(all_states)
        parts = [_torch_stage_part(checkpoint_dir, states, s, claimed)
                 for s, states in enumerate(all_states)]
        loss_scaler = parts[0][1]
        parts = [p for p, _ in parts]
    groups, owner, first = _merge_stages(parts, strict)

    jobs = []
    for name, stage in owner.items():
        part = parts[stage]
        if "tensors" in part:
            for key, tensor in part["tensors"][name].items():
                path = universal.param_file(out_dir, name, key)
                os.makedirs(os.path.dirname(path), exist_ok=True)
                atomic_torch_save({"param": tensor.clone()}, path)
        else:
            job = part["jobs"][name]
            jobs.append(job[:5] + (out_dir,) + job[6:])
    frozen = OrderedDict()
    for part in parts:
        for name, shape in part["sharded_frozen"].items():
            if name not in frozen:
                frozen[name] = shape
                job = part["jobs"][name]
                jobs.append(job[:5] + (out_dir,) + job[6:])
    _pool_map(_merge_param, jobs, merge_workers)
    for states in all_states:
        frozen.update(_write_module_frozen(states, out_dir, set(frozen)))

    module, buffers = OrderedDict(), []
    for states in all_states:
        for key, value in states["module"].items():
            module.setdefault(key, value)
        buffers += [b for b in states.get("buffer_names") or () if b not in buffers]
    for name in owner:
        if name not in module:  # tied weights: from the converted fp32 tensor
            module[name] = universal.load_param_state(out_dir, name, mmap=False).clone()
    model_states = dict(first_states)
    model_states.pop(fp32_script.PIPELINE_STAGES, None)
    model_states.update({"module": module, "optimizer": None, "buffer_names": buffers,
                         "param_shapes": groups, "frozen_param_shapes": dict(frozen),
                         "shared_params": {}, "mp_world_size": 1})
    info = {
        "format": universal.FORMAT, "format_version": universal.FORMAT_VERSION, "tag": tag,
        "source": {"zero_stage": parts[0]["zero_stage"],
                   "dp_world_size": parts[0]["dp_world_size"],
                   "ds_version": str(first_states.get("ds_version")),
                   "pipeline_stages": stages},
        "group_params": [list(g) for g in groups],
        "param_shapes": {n: s for g in groups for n, s in g.items()},
        "frozen_param_shapes": dict(frozen),
        "state_keys": first["state_keys"],
        "optimizer_scalars": first["scalars"],
        "param_groups": first["hyper"],
        "loss_scaler": loss_scaler,
    }
    return _finish(checkpoint_dir, output_folder, tag, info, model_states, keep_temp_folder)


def convert(input_folder, output_folder, num_extract_workers=4, num_merge_workers=2,
            keep_temp_folder=False, strict=True, inject_missing_state=False):
    """Convert one ZeRO checkpoint tag (a save dir's ``latest``, or a tag folder) into a universal
    checkpoint at ``output_folder/<tag>``; returns that folder."""
    checkpoint_dir, tag = resolve_input(input_folder)
    output_folder = os.path.abspath(os.fspath(output_folder))
    out_dir = os.path.join(output_folder, tag)
    temp_dir = os.path.join(output_folder, TEMP_DIRNAME)
    if os.path.abspath(checkpoint_dir) in (output_folder, out_dir):
        raise ValueError(f"--output_folder '{output_folder}' must differ from the input")
    model_states = load_file(os.path.join(checkpoint_dir, model_states_filename(0)))
    if model_states.get(fp32_script.PIPELINE_STAGES) is not None:
        return _convert_pipeline(checkpoint_dir, tag, output_folder, model_states,
                                 num_extract_workers, num_merge_workers, keep_temp_folder,
                                 strict, inject_missing_state)
    shapes = _param_shapes(model_states, inject_missing_state)
    world = _rank_files(checkpoint_dir, strict)
    _fresh_dirs(out_dir, temp_dir)

    summaries = _pool_map(_extract_rank, [(checkpoint_dir, r, world, temp_dir)
                                          for r in range(world)], num_extract_workers)
    _check_ranks_agree(summaries, strict)
    first = summaries[0]
    groups = _groups(first, shapes, model_states)
    if strict and shapes is not None:
        recorded = {n for g in shapes for n in g}
        converted = {n for g in groups for n in g}
        if recorded != converted:
            raise CheckpointFormatError(
                f"'param_shapes' and the optimizer layout disagree on "
                f"{sorted(recorded ^ converted)[:10]} (--no_strict converts the layout's)")
    frozen = _frozen_shapes(model_states, first["frozen"])
    frozen.update(_write_module_frozen(model_states, out_dir, set(frozen)))
    jobs = [(n, s, sorted(set(k) | {universal.FP32_KEY}), world, temp_dir, out_dir, False)
            for g, k in zip(groups, first["state_keys"]) for n, s in g.items()]
    jobs += [(n, frozen[n], [universal.FP32_KEY], world, temp_dir, out_dir, True)
             for n in first["frozen"]]
    _pool_map(_merge_param, jobs, num_merge_workers)

    info = {
        "format": universal.FORMAT, "format_version": universal.FORMAT_VERSION, "tag": tag,
        "source": {"zero_stage": int(first["zero_stage"]), "dp_world_size": world,
                   "ds_version": str(model_states.get("ds_version"))},
        "group_params": [list(g) for g in groups],
        "param_shapes": {n: s for g in groups for n, s in g.items()},
        "frozen_param_shapes": dict(frozen),
        "state_keys": first["state_keys"],
        "optimizer_scalars": first["optimizer_scalars"],
        "param_groups": first["param_groups"],
        "loss_scaler": _load(optim_file(checkpoint_dir, 0))["optimizer_state_dict"].get(
            "loss_scaler"),
    }
    return _finish(checkpoint_dir, output_folder, tag, info,
                   _whole_module(model_states, out_dir, groups, frozen), keep_temp_folder)


def _fresh_dirs(out_dir, temp_dir):
    os.makedirs(out_dir, exist_ok=True)
    shutil.rmtree(temp_dir, ignore_errors=True)
    os.makedirs(temp_dir)


def _finish(checkpoint_dir, output_folder, tag, info, model_states, keep_temp_folder):
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


# ---------------------------------------------------------------------- CLI
def parse_arguments(argv=None):
    parser = argparse.ArgumentParser(
        prog="ds_to_universal",
        description="Convert a DeepSpeed ZeRO (or pipeline) checkpoint into a universal "
                    "checkpoint, loadable "
                    "with any data-parallel size or ZeRO stage via "
                    "\"checkpoint\": {\"load_universal\": true}.")
    parser.add_argument("--input_folder", required=True,
                        help="ZeRO checkpoint: a save dir (its 'latest' tag) or a tag folder")
    parser.add_argument("--output_folder", required=True,
                        help="where to write the universal checkpoint (<output>/<tag>)")
    parser.add_argument("--num_extract_workers", type=int, default=4,
                        help="processes reading source rank files (default 4)")
    parser.add_argument("--num_merge_workers", type=int, default=2,
                        help="processes assembling parameters (default 2)")
    parser.add_argument("--keep_temp_folder", action="store_true",
                        help="keep <output>/tmp, the per-rank fragments")
    parser.add_argument("--strict", dest="strict", action="store_true", default=True,
                        help="fail when files, shapes or ranks disagree (default)")
    parser.add_argument("--no_strict", dest="strict", action="store_false",
                        help="convert what the optimizer layout covers despite disagreements")
    parser.add_argument("--inject_missing_state", action="store_true",
                        help="take parameter shapes from the module weights when the "
                             "model-states file lacks 'param_shapes'")
    args = parser.parse_args(argv)
    for flag in ("num_extract_workers", "num_merge_workers"):
        if getattr(args, flag) < 1:
            parser.error(f"--{flag} must be >= 1, got {getattr(args, flag)}")
    return args


def main(argv=None):
    args = parse_arguments(argv)
    try:
        out = convert(args.input_folder, args.output_folder, args.num_extract_workers,
                      args.num_merge_workers, args.keep_temp_folder, args.strict,
                      args.inject_missing_state)
    except (CheckpointFormatError, FileNotFoundError, ValueError) as err:
        print(f"ds_to_universal: error: {err}", file=sys.stderr)
        return 1
    print(f"ds_to_universal: wrote universal checkpoint '{out}'")
    return 0


if __name__ == "__main__":
    sys.exit(main())
