"""``ds_to_universal`` for MoE checkpoints (``deepspeed.moe.checkpoint``) saved with ZeRO 1/2.

The model-states file holds no expert and records the MoE layout (``moe_checkpoint``); expert E
(global id) of MoE layer L is in ``layer_{L}_expert_{E}_mp_rank_00_model_states.pt``; the ZeRO
rank files hold the fp32 partitions and moments. The param groups of the experts of a layer
split over ranks (``ep_size > 1``, their own groups through
``split_params_into_different_moe_groups_for_optimizer``) are partitioned over the
expert-data-parallel group (``world / ep_size`` ranks) and name the *local* experts
(``deepspeed_experts.<i>``), which on expert-parallel rank ``e`` are the global experts
``e * num_local_experts + i``. Each rank's expert groups are therefore cut with the
expert-data-parallel world and rank of that rank and their names mapped to the global ids (the
names of the model holding every expert, ``ep_size`` 1); the layout records both ranks of
every global rank (``expert_parallel_ranks`` / ``expert_data_parallel_ranks``; checkpoints
without them were saved with the default layout: ep rank ``r % ep_size``, edp rank
``r // ep_size``).

The result is what the ep-1 model would have saved: one folder per parameter under the global
names, the expert groups holding every expert, the module weights with every expert (no
``moe_checkpoint`` entry: nothing is in expert files). It loads with ``load_universal`` into an
engine whose parameter names and groups are the ep-1 model's (``ep_size`` 1, the experts in
their own group), at any data-parallel size and ZeRO stage 0-2.
"""
import re
from collections import OrderedDict

from deepspeed.checkpoint.atomic import CheckpointFormatError

from deepspeed.zero.ds_to_universal_moe_plan import (  # noqa: F401  (re-exported)
    EXPERTS_INFIX, MOE_STATE_KEY, check_supported, layer_of, global_groups, global_name,
    group_layer, group_placement, moe_plan)


# ---------------------------------------------------------------------- without ZeRO
_OPTIM_FILE_RE = re.compile(r"expp_rank_(\d+)_mp_rank_00_optim_states\.pt")


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
    part["hyper"] = [{k: v for k, v in h.items() if not (h.get("moe") and k == "name")}
                     for h in part["hyper"]]
    return part


def convert_plain(checkpoint_dir, tag, output_folder, model_states, strict, keep_temp_folder):
    """``convert`` for an MoE checkpoint saved without ZeRO: the torch optimizer state of the
    ranks holding each expert set is in ``expp_rank_<R>_mp_rank_00_optim_states.pt`` (``R``: the
    lowest global rank among them), mapped to names through ``param_shapes`` (rank 0's, local
    expert names, the same groups on every rank) and then to global expert ids through ``R``'s
    expert-parallel rank; the dense parameters (the same on every rank) come from the first
    file."""
    import os

    from deepspeed.checkpoint import universal
    from deepspeed.checkpoint.atomic import atomic_torch_save, load_file
    from deepspeed.zero import zero_to_fp32 as fp32_script
    from deepspeed.zero.ds_to_universal_phases import (TEMP_DIRNAME, finish, fresh_dirs,
                                                        universal_info, write_module_frozen)
    from deepspeed.zero.ds_to_universal_pipeline import _merge_stages, _torch_stage_part

    moe = model_states[MOE_STATE_KEY]
    world = int(moe["world_size"])
    plan = moe_plan(model_states, world)
    check_supported(model_states, {"zero_stage": 0})
    files = sorted((int(m.group(1)), name) for name in os.listdir(checkpoint_dir)
                   for m in [_OPTIM_FILE_RE.fullmatch(name)] if m)
    if not files:
        raise CheckpointFormatError(f"MoE checkpoint '{checkpoint_dir}' holds no "
                                    f"expp_rank_*_mp_rank_00_optim_states.pt files")
    whole = dict(model_states)
    fp32_script._with_moe_experts(checkpoint_dir, whole)  # every expert, global names
    parts, loss_scaler = [], None
    for index, name in files:
        if index >= world:
            raise CheckpointFormatError(f"'{name}' names rank {index} of a {world}-rank save")
        saved = load_file(os.path.join(checkpoint_dir, name))
        states = dict(model_states, module=_local_module(plan, whole["module"], index),
                      optimizer=saved["optimizer"])
        part, scaler = _torch_stage_part(checkpoint_dir, states, index, set())
        parts.append(_renamed_part(plan, part, index))
        loss_scaler = scaler if loss_scaler is None else loss_scaler
    groups, owner, first = _merge_stages(parts, strict)
    expected = {f"{layer['prefix']}{e}." for layer in plan
                for e in range(layer["ep_size"] * layer["num_local"])}
    held = {n[:len(p)] for n in owner for p in expected if n.startswith(p)}
    if held != expected:
        raise CheckpointFormatError(f"MoE checkpoint '{checkpoint_dir}': the optimizer files "
                                    f"{[n for _, n in files]} lack the state of "
                                    f"{sorted(expected - held)[:4]}")

    out_dir = os.path.join(output_folder, tag)
    fresh_dirs(out_dir, os.path.join(output_folder, TEMP_DIRNAME))
    for name, index in owner.items():
        for key, tensor in parts[index]["tensors"][name].items():
            path = universal.param_file(out_dir, name, key)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            atomic_torch_save({"param": tensor.clone()}, path)
    frozen = write_module_frozen(whole, out_dir, set())
    whole.pop(MOE_STATE_KEY)
    whole.update({"optimizer": None, "param_shapes": groups})
    source = {"zero_stage": 0, "dp_world_size": world,
              "ds_version": str(model_states.get("ds_version")), "moe": moe["layers"]}
    info = universal_info(tag, source, groups, frozen, first["state_keys"], first["scalars"],
                          first["hyper"], loss_scaler)
    return finish(checkpoint_dir, output_folder, tag, info, whole, keep_temp_folder)
