"""MoE checkpoints: every expert in a file of its own, so any expert-parallel layout loads them.

    <tag>/
      mp_rank_00_model_states.pt                          the model without its experts, plus
                                                          ``moe_checkpoint`` (the saved layout)
      layer_{L}_expert_{E}_mp_rank_00_model_states.pt     expert E (global id) of MoE layer L
      expp_rank_{R}_mp_rank_00_optim_states.pt            the optimizer state of the ranks
                                                          holding expert set R (no ZeRO only)

``L`` counts the model's MoE layers in module order (upstream's ``moe_layer_id``), ``E`` is
the global expert id (``expert-parallel rank * num_local_experts + local id``); an expert file
holds that expert's entries under the model's names with the global id (upstream's file
names and keys). Each expert file is written by the rank that owns the expert among the
layer's expert-data-parallel rank 0s, through ``atomic_torch_save`` inside the save hooks, so
the checkpoint engine writes it and a failure on any rank fails the save before ``latest``
moves. Loading, each rank reads the files of its own experts by global id, so the weights load
at any ``ep_size`` / world size.

The optimizer state is per rank when experts are split over ranks (each holds the state of its
own experts) and the core's model-states file is written by data-parallel rank 0 only; without
ZeRO (ZeRO writes per-rank shards itself) the ranks that hold the same experts (the
intersection of their layers' expert-data-parallel groups, identical after every step) write
one file, named by the lowest global rank among them (the expert-parallel rank in the default
layout). It loads only at the layout it was saved with; another layout is refused with the
saved and current ``ep_size``s, and ``load_optimizer_states=False`` loads the weights. To
change the layout with the optimizer state, convert with ``ds_to_universal``: its module
weights hold every expert under the global id, which ``load_experts`` cuts to this rank's, and
``name_experts_globally`` tells the universal loaders which tensors are this rank's. For it
the layout records, per layer, each global rank's expert-parallel and expert-data-parallel
rank and how the experts sit on tensor-parallel ranks (``_tensor_layout``).
"""
import os
import re

from deepspeed import comm as dist
from deepspeed import topology
from deepspeed.checkpoint import atomic_torch_save, load_file
from deepspeed.checkpoint.collective import data_parallel_rank, model_parallel_rank

#: the model-states file entry describing the MoE layout the checkpoint was saved with
MOE_STATE_KEY = "moe_checkpoint"
EXPERTS_INFIX = "deepspeed_moe.experts.deepspeed_experts."


def expert_filename(moe_layer_id, global_expert_id, mp_rank=0):
    return f"layer_{moe_layer_id}_expert_{global_expert_id}_mp_rank_{mp_rank:02d}_model_states.pt"


def optimizer_filename(expp_rank, mp_rank=0):
    return f"expp_rank_{expp_rank}_mp_rank_{mp_rank:02d}_optim_states.pt"


def moe_layers(module):
    """``[(name, MoE)]`` in module order: the index is the layer's ``moe_layer_id``."""
    from deepspeed.moe.layer import MoE

    layers = [(name, m) for name, m in module.named_modules() if isinstance(m, MoE)]
    for _, layer in layers:  # collective only when the groups do not exist yet (every rank)
        layer.set_deepspeed_parallelism()
    return layers


def _experts_prefix(name):
    return f"{name}.{EXPERTS_INFIX}" if name else EXPERTS_INFIX


def _writes_experts(engine, layer):
    """Expert-data-parallel rank 0 of the layer (data-parallel rank 0 for ``ep_size`` 1)."""
    if layer.ep_size == 1:
        return data_parallel_rank(engine) == 0
    from deepspeed.moe.groups import _get_expert_data_parallel_rank

    return _get_expert_data_parallel_rank(layer.expert_group_name) == 0


def _group_ranks(group):
    return {dist.get_global_rank(group, i) for i in range(dist.get_world_size(group=group))}


def _optimizer_state_owner(layers):
    """``(index, writes)``: the ranks holding the same experts of every split layer as this
    rank hold the same optimizer state; the lowest of them names the file and writes it."""
    from deepspeed.moe.groups import _get_expert_data_parallel_group

    same = None
    for _, layer in layers:
        if layer.ep_size > 1:
            ranks = _group_ranks(_get_expert_data_parallel_group(layer.expert_group_name))
            same = ranks if same is None else same & ranks
    index = min(same)
    return index, dist.get_rank() == index


def _rank_tables(layer):
    """``{"expert_parallel_ranks": [...], "expert_data_parallel_ranks": [...]}``: the rank of
    every global rank in its expert-parallel and expert-data-parallel group of a split layer
    (offline tools such as ``ds_to_universal`` map each rank's files through them). Read off
    the layout of ``deepspeed.moe.groups._expert_layout`` that holds this rank's
    expert-parallel group, so no collective is needed. The layout cuts this rank's
    data-parallel ranks (all ranks, or a pipeline stage's); the entries of ranks outside them
    are 0."""
    if layer.ep_size == 1:
        return {}
    from deepspeed.moe.groups import _expert_layout, _get_expert_parallel_group

    world = int(dist.get_world_size())
    data_ranks = [int(r) for r in topology.current().ranks("data")]
    group = _get_expert_parallel_group(layer.expert_group_name)
    mine = [dist.get_global_rank(group, i) for i in range(dist.get_world_size(group=group))]
    for swapped in (False, True):
        expert_lists, data_lists = (
            [[data_ranks[i] for i in ids] for ids in lists]
            for lists in _expert_layout(len(data_ranks), int(layer.ep_size), swapped))
        if mine in expert_lists:
            break
    else:
        return {}
    tables = {}
    for key, lists in (("expert_parallel_ranks", expert_lists),
                       ("expert_data_parallel_ranks", data_lists)):
        table = [0] * world
        for ranks in lists:
            for index, rank in enumerate(ranks):
                table[rank] = index
        tables[key] = table
    return tables


def _tensor_layout(layer):
    """How the layer's experts sit on ``tp`` > 1 tensor-parallel ranks, for offline tools:
    ``{"tensor_replicas": tp}`` for replicated experts, whose gradients are summed (and ZeRO
    partitions their param groups) over every tensor rank's expert-data-parallel group joined
    (``deepspeed.moe.groups``'s expert replica group); ``{"tensor_parallel_experts": tp}`` for
    tensor-parallel ones, whose split parameters declare their pieces (``param_slices``)."""
    from deepspeed.moe.groups import tensor_dim

    tp = int(topology.current().size(tensor_dim()))
    if tp == 1:
        return {}
    return {"tensor_parallel_experts" if layer.enable_expert_tensor_parallelism
            else "tensor_replicas": tp}


def _layout(engine, layers, optimizer_files):
    return {"layers": [{"name": name, "num_experts": int(layer.num_experts),
                        "ep_size": int(layer.ep_size), **_rank_tables(layer),
                        **_tensor_layout(layer)}
                       for name, layer in layers],
            "world_size": int(dist.get_world_size()),
            # the global ranks of this model-parallel slice's data-parallel group (a pipeline
            # stage's), in data-parallel order: which entries of the rank tables its ZeRO
            # files (zero_pp_rank_<data-parallel rank>) were written by
            "data_parallel_ranks": [int(r) for r in topology.current().ranks("data")],
            "optimizer_files": bool(optimizer_files)}


def _describe_layout(layers, world_size):
    sizes = [int(entry["ep_size"]) for entry in layers]
    return f"ep_size={sizes[0] if len(set(sizes)) == 1 else sizes}, world size {world_size}"


def handles_checkpoints(engine):
    """ZeRO-3 holds parameter shards in the module: its plugin saves and loads them."""
    return engine.sharding.stage < 3


def writes_optimizer_files(engine, layers):
    return (engine.optimizer is not None and engine.sharding.stage == 0
            and any(layer.ep_size > 1 for _, layer in layers))


# ------------------------------------------------------------------ save
def save_optimizer_state(engine, checkpoint_dir):
    """Write this rank's optimizer state when experts are split and nobody else does (no
    ZeRO); True tells the core to store ``optimizer: None``."""
    if not handles_checkpoints(engine):
        return None
    layers = moe_layers(engine.module)
    if not writes_optimizer_files(engine, layers):
        return None
    index, writes = _optimizer_state_owner(layers)
    if writes:
        mp = model_parallel_rank(engine)
        atomic_torch_save({"optimizer": engine.optimizer.state_dict(),
                           "ep_sizes": [int(layer.ep_size) for _, layer in layers]},
                          os.path.join(checkpoint_dir, optimizer_filename(index, mp)))
    return True


def save_experts(engine, checkpoint_dir, state, exclude_frozen_parameters):
    """Move every expert out of ``state["module"]`` into its own file; record the layout."""
    if not handles_checkpoints(engine):
        return
    layers = moe_layers(engine.module)
    if not layers:
        return
    mp = model_parallel_rank(engine)
    weights = state.get("module")
    for moe_layer_id, (name, layer) in enumerate(layers):
        prefix = _experts_prefix(name)
        if weights is not None:
            for key in [k for k in weights if k.startswith(prefix)]:
                del weights[key]
        if not _writes_experts(engine, layer):
            continue
        experts = layer.deepspeed_moe.experts.deepspeed_experts
        first = layer.expert_parallel_rank() * layer.num_local_experts
        for local_id, expert in enumerate(experts):
            global_id = first + local_id
            frozen = {n for n, p in expert.named_parameters() if not p.requires_grad}
            entries = {f"{prefix}{global_id}.{key}": value.detach().clone()
                       for key, value in expert.state_dict().items()
                       if not (exclude_frozen_parameters and key in frozen)}
            atomic_torch_save(entries, os.path.join(checkpoint_dir,
                                                    expert_filename(moe_layer_id, global_id, mp)))
    state[MOE_STATE_KEY] = _layout(engine, layers, writes_optimizer_files(engine, layers))


# ------------------------------------------------------------------ load
def _check_same_layers(checkpoint_dir, saved, layers):
    if len(saved) != len(layers):
        raise ValueError(f"checkpoint '{checkpoint_dir}' holds {len(saved)} MoE layer(s) and "
                         f"the model has {len(layers)}; MoE layers are matched by their order")
    for moe_layer_id, (entry, (name, layer)) in enumerate(zip(saved, layers)):
        if int(entry["num_experts"]) != layer.num_experts:
            raise ValueError(
                f"checkpoint '{checkpoint_dir}': MoE layer {moe_layer_id} ('{name or '<model>'}') "
                f"was saved with num_experts={entry['num_experts']} and the model has "
                f"num_experts={layer.num_experts}")


def _expert_entries(checkpoint_dir, moe_layer_id, global_id, mp, prefix, local_id):
    path = os.path.join(checkpoint_dir, expert_filename(moe_layer_id, global_id, mp))
    if not os.path.isfile(path):
        raise FileNotFoundError(f"checkpoint file '{path}' (expert {global_id} of MoE layer "
                                f"{moe_layer_id}) does not exist")
    marker = re.compile(rf"(^|\.){re.escape(EXPERTS_INFIX)}{global_id}\.")
    entries = {}
    for key, value in load_file(path).items():
        found = marker.search(key)
        if found is None:
            raise ValueError(f"'{path}': entry '{key}' is not an entry of expert {global_id}")
        entries[f"{prefix}{local_id}.{key[found.end():]}"] = value
    return entries


def name_experts_globally(module):
    """Declare the universal-checkpoint name (``deepspeed.hooks.UNIVERSAL_CHECKPOINT_NAME``) of
    every expert parameter of a layer split over ranks: its name with the global expert id
    (``ep_rank * num_local_experts + local id``), the name the model holding every expert
    gives it and ``ds_to_universal`` stores it under. Universal loaders (core without ZeRO,
    ZeRO 1/2) then read this rank's experts and their optimizer moments."""
    from deepspeed.hooks import UNIVERSAL_CHECKPOINT_NAME

    for name, layer in moe_layers(module):
        experts = layer.deepspeed_moe.experts.deepspeed_experts
        first = layer.expert_parallel_rank() * layer.num_local_experts
        for key, param in experts.named_parameters():
            if layer.ep_size == 1:  # its module name (a pipeline stage may have declared it)
                continue
            local, rest = key.split(".", 1)
            setattr(param, UNIVERSAL_CHECKPOINT_NAME,
                    f"{_experts_prefix(name)}{first + int(local)}.{rest}")


def _whole_model_weights(layers, state_dict):
    """``state_dict`` with each split layer's experts cut to this rank's, renamed to the local
    ids, when it holds every expert of every split layer under the global ids (a universal
    checkpoint's module weights: the model holding every expert); else None."""
    split = [(name, layer) for name, layer in layers if layer.ep_size > 1]
    if not split:
        return None
    weights = dict(state_dict)
    for name, layer in split:
        prefix = _experts_prefix(name)
        entries = {key: weights.pop(key) for key in [k for k in weights if k.startswith(prefix)]}
        held = {int(key[len(prefix):].split(".", 1)[0]) for key in entries}
        if held != set(range(layer.num_experts)):
            return None
        first = layer.expert_parallel_rank() * layer.num_local_experts
        for key, value in entries.items():
            global_id, rest = key[len(prefix):].split(".", 1)
            local = int(global_id) - first
            if 0 <= local < layer.num_local_experts:
                weights[f"{prefix}{local}.{rest}"] = value
    return weights


def load_experts(engine, state_dict, checkpoint_dir, state):
    """The module's weights from the model-states entry plus this rank's expert files;
    ``(missing, unexpected)`` or None when the checkpoint has no MoE entry. Model weights
    holding every expert under its global id (a universal checkpoint) load into a model with
    experts split over ranks: each rank keeps its own."""
    saved = state.get(MOE_STATE_KEY)
    if state_dict is None or not handles_checkpoints(engine):
        return None
    if saved is None:
        weights = _whole_model_weights(moe_layers(engine.module), state_dict)
        if weights is None:
            return None
        result = engine.module.load_state_dict(weights, strict=False)
        return list(result.missing_keys), list(result.unexpected_keys)
    layers = moe_layers(engine.module)
    _check_same_layers(checkpoint_dir, saved["layers"], layers)
    mp = model_parallel_rank(engine)
    weights = dict(state_dict)
    for moe_layer_id, (name, layer) in enumerate(layers):
        prefix = _experts_prefix(name)
        first = layer.expert_parallel_rank() * layer.num_local_experts
        for local_id in range(layer.num_local_experts):
            weights.update(_expert_entries(checkpoint_dir, moe_layer_id, first + local_id, mp,
                                           prefix, local_id))
    result = engine.module.load_state_dict(weights, strict=False)
    return list(result.missing_keys), list(result.unexpected_keys)


def load_optimizer_state(engine, checkpoint_dir, state):
    """Refuse another layout's optimizer state; restore this rank's file at the same one."""
    saved = state.get(MOE_STATE_KEY)
    if saved is None or not handles_checkpoints(engine):
        return None
    layers = moe_layers(engine.module)
    current = _layout(engine, layers, writes_optimizer_files(engine, layers))
    saved_sizes = [int(entry["ep_size"]) for entry in saved["layers"]]
    current_sizes = [int(entry["ep_size"]) for entry in current["layers"]]
    same_world = int(saved["world_size"]) == current["world_size"]
    split = any(size > 1 for size in saved_sizes + current_sizes)
    if saved_sizes != current_sizes or (split and not same_world):
        raise ValueError(
            f"checkpoint '{checkpoint_dir}' was saved with "
            f"{_describe_layout(saved['layers'], saved['world_size'])} and this engine has "
            f"{_describe_layout(current['layers'], current['world_size'])}: the optimizer "
            f"states (per expert-parallel rank) cannot be loaded into another expert layout; "
            f"load with load_optimizer_states=False or load_module_only=True to restore the "
            f"weights only (each expert is saved in its own file and loads at any ep_size)")
    if not saved.get("optimizer_files"):
        return None  # the core's (or ZeRO's) own optimizer state
    if engine.optimizer is None:
        return None
    if not writes_optimizer_files(engine, layers):
        raise ValueError(f"checkpoint '{checkpoint_dir}' holds per-expert-parallel-rank "
                         f"optimizer files (saved without ZeRO) and this engine uses ZeRO stage "
                         f"{engine.sharding.stage}; load with load_optimizer_states=False")
    index, _ = _optimizer_state_owner(layers)
    path = os.path.join(checkpoint_dir, optimizer_filename(index, model_parallel_rank(engine)))
    if not os.path.isfile(path):
        raise FileNotFoundError(f"checkpoint file '{path}' (the optimizer state of the ranks "
                                f"holding this rank's experts) does not exist")
    engine.optimizer.load_state_dict(load_file(path)["optimizer"])
    return True
