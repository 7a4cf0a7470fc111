"""``ds_to_universal`` of a pipeline checkpoint (``pipeline_stages`` in its model-states files),
with or without ZeRO inside the stages; ``deepspeed.zero.ds_to_universal.convert`` hands such a
checkpoint to ``convert_pipeline``.

A pipeline checkpoint has one model-states file per stage (``mp_rank_<stage>``, module None: the
layers are in ``layer_XX-model_states.pt`` under their global index) and, with ZeRO inside the
stages, one set of rank files per stage (``zero_pp_rank_<dp>_mp_rank_<stage>``). Each stage is
read on its own, as ``zero_to_fp32`` does (without ZeRO, from the torch optimizer state in its
model-states file), and the results merged under the PipelineModule's global names
(``3.weight``, ``tied_modules.<key>.weight``; a tied weight, held by every stage using it, is
taken once, from the first), the param groups group by group: the universal checkpoint is then
the one a single-stage model with those names would have produced. A tensor-parallel
checkpoint (pipeline or not) has one model-states file per model-parallel rank (``stage * tp +
tensor rank``); each is read as a part and the tensor ranks of a stage joined first
(``deepspeed.zero.ds_to_universal_tp``). A rank with MoE layers has its experts read from their
files under global names (``deepspeed.zero.ds_to_universal_moe``); saved without ZeRO with
experts split over ranks, its part comes from its per-expert-set optimizer files.
"""
import os
import re
from collections import OrderedDict

import torch

from deepspeed.checkpoint import universal
from deepspeed.checkpoint.atomic import CheckpointFormatError, atomic_torch_save, load_file
from deepspeed.checkpoint.layout import model_states_filename
from deepspeed.zero import ds_to_universal_moe as moe
from deepspeed.zero import ds_to_universal_tp as tensor_parallel
from deepspeed.zero import zero_to_fp32 as fp32_script
from deepspeed.zero.ds_to_universal_phases import (
    TEMP_DIRNAME, check_ranks_agree, checked_groups, extract_rank, finish, fresh_dirs,
    frozen_shapes, merge_jobs, merge_param, param_shapes, pool_map, rank_world, saved_loss_scaler,
    universal_info, write_module_frozen)

# an MoE rank's model states as saved (its writer's local expert names), kept next to the
# renamed ones for reading the optimizer files saved without ZeRO (``moe.plain_part``)
_SAVED_STATES = "_saved_model_states"
_LAYER_FILE_RE = re.compile(r"^layer_(\d+)(?:-model_(\d+))?-model_states\.pt$")


def _same(a, b):
    try:
        return bool(a == b)
    except (RuntimeError, TypeError):  # tensors of several elements
        return repr(a) == repr(b)


def _stage_states(checkpoint_dir, mp_rank, mp_world, tp, first):
    """Model-parallel rank ``mp_rank``'s model states, ``module`` filled from the layer files
    (global names: the stage's trained, frozen and buffer entries; tied modules' weights are
    not there)."""
    if mp_rank == 0:
        states = first
    else:
        path = os.path.join(checkpoint_dir, model_states_filename(mp_rank))
        if not os.path.isfile(path):
            raise CheckpointFormatError(f"'{checkpoint_dir}' is a checkpoint of {mp_world} "
                                        f"model-parallel ranks (pipeline stages x tensor "
                                        f"ranks) but lacks {os.path.basename(path)}")
        states = load_file(path)
    states = saved = dict(states)
    if states.get("module") is None:
        states["module"] = fp32_script._pipeline_layer_entries(checkpoint_dir, states,
                                                               tensor_rank=mp_rank % tp)
    moe_state = states.get(moe.MOE_STATE_KEY)
    if moe_state is not None:  # every expert of the rank, from its expert files
        ranks = moe_state.get("data_parallel_ranks") or range(int(moe_state["world_size"]))
        states = moe.with_global_experts(checkpoint_dir, states,
                                         moe.moe_plan(states, len(ranks)), mp_rank)
        states[_SAVED_STATES] = saved
    return states


def _zero_stage_parts(checkpoint_dir, all_states, temp_dir, out_dir, workers, strict, inject,
                      tp=1):
    """Per model-parallel rank: its groups, state keys, scalars, hyperparameters and merge
    jobs, after extracting every (model-parallel, data-parallel rank) file's fragments into
    ``tmp/stage_XX``. ``out_dir`` None: each rank's jobs write into ``tmp/stage_XX/whole``
    (its pieces of split parameters, joined afterwards)."""
    worlds = [rank_world(checkpoint_dir, strict, mp_rank=s) for s in range(len(all_states))]
    temps = [os.path.join(temp_dir, f"stage_{s:02d}") for s in range(len(all_states))]
    plans = moe.join_tensor_replicas([moe.moe_plan(states, world)
                                      for states, world in zip(all_states, worlds)], tp, temps)
    summaries = pool_map(extract_rank, [(checkpoint_dir, r, worlds[s], temps[s], s, plans[s])
                                        for s in range(len(all_states))
                                        for r in range(worlds[s])], workers,
                         desc="extracting rank files")
    parts = []
    for stage, states in enumerate(all_states):
        mine, summaries = summaries[:worlds[stage]], summaries[worlds[stage]:]
        check_ranks_agree(mine, strict)
        first = mine[0]
        groups = checked_groups(first, param_shapes(states, inject), states, strict,
                                where=f"pipeline stage {stage}: ")
        hyper = first["param_groups"]
        if plans[stage]:  # experts under their global ids (the ep-1 model's names)
            groups = moe.global_groups(plans[stage], first["layout"], groups)
            hyper = moe.layout_free_hyper(hyper)
        sharded = frozen_shapes(states, first["frozen"])
        whole_dir = out_dir or os.path.join(temps[stage], "whole")
        parts.append({"groups": groups, "state_keys": first["state_keys"],
                      "scalars": first["optimizer_scalars"], "hyper": hyper,
                      "zero_stage": int(first["zero_stage"]), "dp_world_size": worlds[stage],
                      "sharded_frozen": sharded,
                      "jobs": moe.replica_jobs(plans[stage], merge_jobs(
                          groups, first["state_keys"], sharded, worlds[stage], temps[stage],
                          whole_dir), stage % tp), "whole_dir": whole_dir})
    return parts, saved_loss_scaler(checkpoint_dir)


def _claimed_layers(all_states):
    """Global layer indices some stage names an entry of (``<idx>.<key>``)."""
    names = set()
    for states in all_states:
        names |= {n for g in states.get("param_shapes") or [] for n in g}
        names |= set(states.get("buffer_names") or ())
        names |= set((states.get("frozen_param_shapes") or {}).keys())
    return {int(n.split(".", 1)[0]) for n in names if n.split(".", 1)[0].isdigit()}


def _tied_weight(checkpoint_dir, name, shape, claimed, tensor_rank):
    """The weight of a tied module without ZeRO or fp32 masters: only the layer file of a layer
    that is the tied module (an index no global name claims) holds it, under its local key. A
    grid with a tensor axis writes one layer file per tensor rank (``-model_YY``); only
    ``tensor_rank``'s hold its piece of a split tied weight."""
    parts = name.split(".", 2)
    if len(parts) != 3 or parts[0] != "tied_modules":
        raise CheckpointFormatError(f"parameter {name!r} is in no layer file of the pipeline "
                                    f"checkpoint '{checkpoint_dir}'")
    found = []
    for file in sorted(os.listdir(checkpoint_dir)):
        match = _LAYER_FILE_RE.match(file)
        if match is None or int(match.group(1)) in claimed or \
                int(match.group(2) or tensor_rank) != tensor_rank:
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


def _torch_stage_part(checkpoint_dir, states, stage, claimed, tensor_rank=0):
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
                weight = _tied_weight(checkpoint_dir, name, shape, claimed, tensor_rank)
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


# how a stage's part is read from a torch optimizer state and parts are merged, for the MoE
# conversion (``ds_to_universal_moe.plain_part``), which cannot import this module
STAGE_IO = (_torch_stage_part, _merge_stages)


def _model_parallel_shape(checkpoint_dir, first_states):
    """``(stages, tensor-parallel size)`` of the checkpoint: ``mp_world_size`` counts pipe x
    tensor ranks (a pipeline's grid) or tensor ranks alone."""
    stages = int(first_states.get(fp32_script.PIPELINE_STAGES) or 1)
    mp_world = int(first_states.get("mp_world_size") or stages)
    if mp_world % stages:
        raise CheckpointFormatError(
            f"'{checkpoint_dir}' records {mp_world} model-parallel ranks for {stages} pipeline "
            f"stages; the ranks must be stages x tensor-parallel ranks")
    mp_ranks = fp32_script._mp_ranks(checkpoint_dir)
    if mp_ranks and mp_ranks != list(range(mp_world)):
        raise CheckpointFormatError(
            f"'{checkpoint_dir}' holds ZeRO files of model-parallel ranks {mp_ranks}, its model "
            f"states name {mp_world} ({stages} pipeline stages x {mp_world // stages} tensor "
            f"ranks); the checkpoint is incomplete")
    return stages, mp_world // stages, bool(mp_ranks)


def convert_pipeline(checkpoint_dir, tag, output_folder, first_states, extract_workers,
                     merge_workers, keep_temp_folder, strict, inject_missing_state):
    """``convert`` for a pipeline or tensor-parallel checkpoint whose model-parallel rank 0
    model states are ``first_states``: every model-parallel rank read as a part, the tensor
    ranks of each stage joined (``deepspeed.zero.ds_to_universal_tp``), the stages merged."""
    stages, tp, zero = _model_parallel_shape(checkpoint_dir, first_states)
    out_dir = os.path.join(output_folder, tag)
    temp_dir = os.path.join(output_folder, TEMP_DIRNAME)
    all_states = [_stage_states(checkpoint_dir, m, stages * tp, tp, first_states)
                  for m in range(stages * tp)]
    fresh_dirs(out_dir, temp_dir)
    if zero:
        parts, loss_scaler = _zero_stage_parts(checkpoint_dir, all_states, temp_dir,
                                               out_dir if tp == 1 else None, extract_workers,
                                               strict, inject_missing_state, tp)
    else:
        claimed = _claimed_layers(all_states)
        parts = [moe.plain_part(checkpoint_dir, states, states[_SAVED_STATES], s, strict,
                                STAGE_IO, claimed, s % tp)
                 if (states.get(moe.MOE_STATE_KEY) or {}).get("optimizer_files") else
                 _torch_stage_part(checkpoint_dir, states, s, claimed, s % tp)
                 for s, states in enumerate(all_states)]
        loss_scaler = parts[0][1]
        parts = [p for p, _ in parts]
    if tp > 1:
        if zero:  # each rank's pieces whole first, in its own folder
            pool_map(merge_param, [j for p in parts for j in p["jobs"].values()],
                     merge_workers, desc="merging parameters")
        parts = [tensor_parallel.join_stage(parts[s * tp:(s + 1) * tp], all_states, s, tp)
                 for s in range(stages)]
    groups, owner, first = _merge_stages(parts, strict)

    jobs = []
    for name, stage in owner.items():
        part = parts[stage]
        if "pieces" in part:
            keys = {universal.FP32_KEY} | {k for g, ks in zip(part["groups"], part["state_keys"])
                                           if name in g for k in ks}
            tensor_parallel.write_joined(part, name, sorted(keys), out_dir)
        elif "tensors" in part:
            for key, tensor in part["tensors"][name].items():
                path = universal.param_file(out_dir, name, key)
                os.makedirs(os.path.dirname(path), exist_ok=True)
                atomic_torch_save({"param": tensor.clone()}, path)
        else:
            jobs.append(part["jobs"][name])
    frozen = OrderedDict()
    for part in parts:
        if tp > 1:  # each tensor rank's pieces joined, ZeRO-3 shards merged per rank already
            frozen.update(tensor_parallel.write_frozen(part, out_dir, frozen))
        for name, shape in part["sharded_frozen"].items():
            if name not in frozen:
                frozen[name] = shape
                jobs.append(part["jobs"][name])
    pool_map(merge_param, jobs, merge_workers, desc="merging parameters")
    if tp == 1:
        for states in all_states:
            frozen.update(write_module_frozen(states, out_dir, set(frozen)))

    module = OrderedDict()
    if tp > 1:
        shapes = {**{n: s for g in groups for n, s in g.items()}, **frozen}
        module = tensor_parallel.joined_module(all_states, tp, out_dir, parts, shapes)
    buffers = []
    for states in all_states:
        for key, value in states["module"].items():
            module.setdefault(key, value)
        buffers += [b for b in states.get("buffer_names") or () if b not in buffers]
    for name in owner:
        if name not in module:  # tied weights: from the converted fp32 tensor
            module[name] = universal.load_param_state(out_dir, name, mmap=False).clone()
    model_states = dict(first_states)
    model_states.pop(fp32_script.PIPELINE_STAGES, None)
    model_states.pop(moe.MOE_STATE_KEY, None)  # every expert is in the module now
    model_states.update({"module": module, "optimizer": None, "buffer_names": buffers,
                         "param_shapes": groups, "frozen_param_shapes": dict(frozen),
                         "shared_params": {}, "mp_world_size": 1})
    model_states.pop(tensor_parallel.PARAM_SLICES, None)
    source = {"zero_stage": parts[0]["zero_stage"], "dp_world_size": parts[0]["dp_world_size"],
              "ds_version": str(first_states.get("ds_version")), "pipeline_stages": stages,
              "tensor_parallel_size": tp}
    info = universal_info(tag, source, groups, frozen, first["state_keys"], first["scalars"],
                          first["hyper"], loss_scaler)
    return finish(checkpoint_dir, output_folder, tag, info, model_states, keep_temp_folder)
