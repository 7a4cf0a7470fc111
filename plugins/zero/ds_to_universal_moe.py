"""``ds_to_universal`` for MoE checkpoints (``deepspeed.moe.checkpoint``): with ZeRO 1-3 or
without ZeRO, alone, tensor-parallel or inside a pipeline.

The model-states file holds no expert and records the MoE layout (``moe_checkpoint``); expert E
(global id) of MoE layer L is in ``layer_{L}_expert_{E}_mp_rank_XX_model_states.pt`` (one set
per model-parallel rank: tensor rank or pipeline stage); the ZeRO rank files hold the fp32
partitions and moments. The param groups of the experts of a layer split over ranks
(``ep_size > 1``, their own groups through
``split_params_into_different_moe_groups_for_optimizer``) are partitioned over the
expert-data-parallel group (``world / ep_size`` ranks) and name the *local* experts
(``deepspeed_experts.<i>``), which on expert-parallel rank ``e`` are the global experts
``e * num_local_experts + i``. Each rank's expert groups are therefore cut with the
expert-data-parallel world and rank of that rank and their names mapped to the global ids (the
names of the model holding every expert, ``ep_size`` 1); the layout records both ranks of
every global rank (``expert_parallel_ranks`` / ``expert_data_parallel_ranks``; checkpoints
without them were saved with the default layout: ep rank ``r % ep_size``, edp rank
``r // ep_size``). What the model-states file records per parameter name for its writer's
local experts (``frozen_param_shapes``: frozen experts, whole in the expert files;
``param_slices``: experts split over tensor ranks) is renamed the same way
(``with_global_experts``).

Without ZeRO and with experts split over ranks, the optimizer state is in one file per set of
ranks holding the same experts (``expp_rank_<R>_mp_rank_XX_optim_states.pt``); ``plain_part``
reads a model-parallel rank's files into one part (the pipeline conversion's unit). ZeRO-3
(``ep_size`` 1 only: experts are ordinary parameters of its shards) needs nothing of this module.

The result is what the ep-1 model would have saved: one folder per parameter under the global
names, the expert groups holding every expert, the module weights with every expert (no
``moe_checkpoint`` entry: nothing is in expert files). It loads with ``load_universal`` into an
engine whose parameter names and groups are the ep-1 model's (the experts in their own
group), at any ``ep_size``, data-parallel size, ZeRO stage, number of pipeline stages or
tensor-parallel size.
"""
import os
import re
from collections import OrderedDict

from deepspeed.checkpoint.atomic import CheckpointFormatError

from deepspeed.zero.ds_to_universal_moe_plan import (  # noqa: F401  (re-exported)
    EXPERTS_INFIX, MOE_STATE_KEY, global_entries, layer_of, global_groups, global_name,
    group_layer, group_placement, join_tensor_replicas, layout_free_hyper, moe_plan,
    replica_jobs)

PARAM_SLICES = "param_slices"


def with_global_experts(checkpoint_dir, states, plan, mp_rank=0):
    """``states`` (a model-states file's dict, not modified) with every expert of model-parallel
    rank ``mp_rank`` in ``module`` (from the expert files, global names) and its
    ``frozen_param_shapes`` / ``param_slices`` under the global names."""
    from deepspeed.zero import zero_to_fp32 as fp32_script

    _check_tensor_parallel_experts(states, mp_rank)
    states = dict(states)
    fp32_script._with_moe_experts(checkpoint_dir, states, mp_rank)
    states["frozen_param_shapes"] = global_entries(plan, states.get("frozen_param_shapes"))
    if states.get(PARAM_SLICES):
        states[PARAM_SLICES] = global_entries(plan, states[PARAM_SLICES])
    return states


def _check_tensor_parallel_experts(states, mp_rank):
    """Tensor-parallel experts (``enable_expert_tensor_parallelism``) join like any split
    parameter, by the pieces their model states declare (``param_slices``); a layer none of
    whose expert parameters declares one would be taken from tensor rank 0 alone."""
    slices = states.get(PARAM_SLICES) or {}
    for index, layer in enumerate(states[MOE_STATE_KEY]["layers"]):
        tp = int(layer.get("tensor_parallel_experts", 1))
        prefix = f"{layer['name']}.{EXPERTS_INFIX}" if layer["name"] else EXPERTS_INFIX
        if tp > 1 and not any(name.startswith(prefix) for name in slices):
            raise CheckpointFormatError(
                f"model-parallel rank {mp_rank}: MoE layer {index} ('{layer['name']}') has "
                f"experts split over {tp} tensor-parallel ranks, but none of its parameters "
                f"'{prefix}*' records its piece in '{PARAM_SLICES}', so the pieces cannot be "
                f"joined; mark the split expert parameters with Megatron's "
                f"tensor_model_parallel=True and partition_dim (or deepspeed.hooks."
                f"UNIVERSAL_CHECKPOINT_SLICE) before saving, or use replicated experts "
                f"(enable_expert_tensor_parallelism=False)")


# ---------------------------------------------------------------------- without ZeRO
_OPTIM_FILE_RE = re.compile(r"expp_rank_(\d+)_mp_rank_(\d+)_optim_states\.pt")


def plain_files(checkpoint_dir, mp_rank):
    """``[(R, file name)]`` of model-parallel rank ``mp_rank``'s per-expert-set optimizer files."""
    return sorted((int(m.group(1)), name) for name in os.listdir(checkpoint_dir)
                  for m in [_OPTIM_FILE_RE.fullmatch(name)] if m and int(m.group(2)) == mp_rank)


def _local_module(plan, module, index):
    """The whole module (every expert, global names) as the ranks of optimizer file ``index``
    hold it: the dense weights and their own experts under their local names."""
    out = OrderedDict()
    for key, value in module.items():
        layer = layer_of(plan, key)
        if layer is None:
            out[key] = value
            continue
        ep_rank = layer["ep_ranks"][index]
        expert, rest = key[len(layer["prefix"]):].split(".", 1)
        local = int(expert) - ep_rank * layer["num_local"]
        if 0 <= local < layer["num_local"]:
            out[f"{layer['prefix']}{local}.{rest}"] = value
    return out


def _renamed_part(plan, part, index):
    """A ``_torch_stage_part`` of optimizer file ``index`` under the global expert names."""
    def rename(name):
        layer = layer_of(plan, name)
        return name if layer is None else global_name(layer, name, layer["ep_ranks"][index])

    part["groups"] = [OrderedDict((rename(n), s) for n, s in g.items()) for g in part["groups"]]
    part["tensors"] = OrderedDict((rename(n), t) for n, t in part["tensors"].items())
    part["hyper"] = layout_free_hyper(part["hyper"])
    return part


def plain_part(checkpoint_dir, states, local_states, mp_rank, strict, stage_io,
               claimed=frozenset(), tensor_rank=0):
    """``(part, loss_scaler)`` of model-parallel rank ``mp_rank`` of an MoE checkpoint saved
    without ZeRO with experts split over ranks (a part as the pipeline conversion reads one
    from a torch optimizer state, holding every expert under its global name). ``states``: the
    rank's model states with every expert (``with_global_experts``); ``local_states``: as
    saved (``param_shapes`` of the writer's local experts); ``stage_io``: the pipeline
    conversion's ``(read a torch part, merge parts)`` functions, handed in because that module
    imports this one. The torch optimizer state of the ranks holding each expert set is in
    ``expp_rank_<R>_mp_rank_XX_optim_states.pt`` (``R``: the lowest global rank among them),
    mapped to names through ``param_shapes`` (the same groups on every rank) and then to global
    expert ids through ``R``'s expert-parallel rank; the dense parameters (the same on every
    rank) come from the first file."""
    from deepspeed.checkpoint.atomic import load_file

    read_part, merge_parts = stage_io
    moe = states[MOE_STATE_KEY]
    ranks = [int(r) for r in moe.get("data_parallel_ranks") or range(int(moe["world_size"]))]
    plan = moe_plan(states, len(ranks))
    files = plain_files(checkpoint_dir, mp_rank)
    if not files:
        raise CheckpointFormatError(
            f"MoE checkpoint '{checkpoint_dir}' holds no expp_rank_*_mp_rank_{mp_rank:02d}"
            f"_optim_states.pt files (the optimizer state of model-parallel rank {mp_rank}, "
            f"saved without ZeRO)")
    parts, loss_scaler = [], None
    for rank, name in files:
        if rank not in ranks:
            raise CheckpointFormatError(f"'{name}' names rank {rank}, not one of the "
                                        f"data-parallel ranks {ranks} that saved the checkpoint")
        index = ranks.index(rank)
        saved = load_file(os.path.join(checkpoint_dir, name))
        rank_states = dict(local_states, module=_local_module(plan, states["module"], index),
                           optimizer=saved["optimizer"])
        part, scaler = read_part(checkpoint_dir, rank_states, mp_rank, claimed, tensor_rank)
        parts.append(_renamed_part(plan, part, index))
        loss_scaler = scaler if loss_scaler is None else loss_scaler
    groups, owner, first = merge_parts(parts, strict)
    expected = {f"{layer['prefix']}{e}." for layer in plan
                for e in range(layer["ep_size"] * layer["num_local"])}
    held = {p for n in owner for p in expected if n.startswith(p)}
    if held != expected:
        raise CheckpointFormatError(f"MoE checkpoint '{checkpoint_dir}': the optimizer files "
                                    f"{[n for _, n in files]} lack the state of "
                                    f"{sorted(expected - held)[:4]}")
    tensors = OrderedDict((n, parts[i]["tensors"][n]) for n, i in owner.items())
    return {"groups": groups, "state_keys": first["state_keys"], "scalars": first["scalars"],
            "hyper": first["hyper"], "zero_stage": 0, "dp_world_size": len(ranks),
            "sharded_frozen": {}, "tensors": tensors}, loss_scaler


def convert_plain(checkpoint_dir, tag, output_folder, model_states, strict, keep_temp_folder,
                  stage_io):
    """``convert`` for an MoE checkpoint of one model-parallel rank saved without ZeRO with
    experts split over ranks (``plain_part``)."""
    from deepspeed.checkpoint import universal
    from deepspeed.checkpoint.atomic import atomic_torch_save
    from deepspeed.zero.ds_to_universal_phases import (TEMP_DIRNAME, finish, fresh_dirs,
                                                        universal_info, write_module_frozen)

    moe = model_states[MOE_STATE_KEY]
    plan = moe_plan(model_states, len(moe.get("data_parallel_ranks") or
                                      range(int(moe["world_size"]))))
    whole = with_global_experts(checkpoint_dir, model_states, plan)
    part, loss_scaler = plain_part(checkpoint_dir, whole, model_states, 0, strict, stage_io)
    out_dir = os.path.join(output_folder, tag)
    fresh_dirs(out_dir, os.path.join(output_folder, TEMP_DIRNAME))
    for name, keys in part["tensors"].items():
        for key, tensor in keys.items():
            path = universal.param_file(out_dir, name, key)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            atomic_torch_save({"param": tensor.clone()}, path)
    frozen = write_module_frozen(whole, out_dir, set())
    whole.pop(MOE_STATE_KEY)
    whole.update({"optimizer": None, "param_shapes": part["groups"]})
    source = {"zero_stage": 0, "dp_world_size": part["dp_world_size"],
              "ds_version": str(model_states.get("ds_version")), "moe": moe["layers"]}
    info = universal_info(tag, source, part["groups"], frozen, part["state_keys"],
                          part["scalars"], part["hyper"], loss_scaler)
    return finish(checkpoint_dir, output_folder, tag, info, whole, keep_temp_folder)
