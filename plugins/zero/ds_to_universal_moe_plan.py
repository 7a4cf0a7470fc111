"""Where an MoE checkpoint's expert partitions sit (``ds_to_universal`` for MoE): which split
layer a ZeRO param group holds, the expert-data-parallel world and rank it was cut with (for
experts replicated over tensor ranks: the replica group's, whose fragments meet in one folder),
and the global names of its local experts. Plain data and arithmetic, shared by the extract
phase (``ds_to_universal_phases``), the MoE conversion (``ds_to_universal_moe``) and a
pipeline's (``ds_to_universal_pipeline``), importing none.
"""
from collections import OrderedDict

from deepspeed.checkpoint.atomic import CheckpointFormatError

MOE_STATE_KEY = "moe_checkpoint"
EXPERTS_INFIX = "deepspeed_moe.experts.deepspeed_experts."


def moe_plan(model_states, world):
    """The split MoE layers of an MoE checkpoint saved by ``world`` ranks, as plain data for
    the extract workers: ``[{"prefix", "ep_size", "num_local", "ep_ranks", "edp_ranks"}]``;
    ``None`` when the checkpoint is not an MoE one."""
    moe = model_states.get(MOE_STATE_KEY)
    if moe is None:
        return None
    saved_world = int(moe.get("world_size", world))
    # the global ranks whose ZeRO files these are (a pipeline stage's data-parallel ranks)
    ranks = [int(r) for r in moe.get("data_parallel_ranks") or range(saved_world)]
    if len(ranks) != world:
        raise CheckpointFormatError(f"the MoE layout was saved by {len(ranks)} data-parallel "
                                    f"ranks and the ZeRO files by {world}: the files are from "
                                    f"different saves")
    plan = []
    for index, layer in enumerate(moe["layers"]):
        ep = int(layer["ep_size"])
        if ep == 1 and int(layer.get("tensor_replicas", 1)) == 1:
            continue  # experts replicated like dense weights: global names already
        num_experts = int(layer["num_experts"])
        ep_ranks = list(layer.get("expert_parallel_ranks") or
                        [r % ep for r in range(saved_world)])
        edp_ranks = list(layer.get("expert_data_parallel_ranks") or
                         [r // ep for r in range(saved_world)])
        if len(ep_ranks) != saved_world or len(edp_ranks) != saved_world or num_experts % ep:
            raise CheckpointFormatError(f"MoE layer {index} ('{layer['name']}') records a layout "
                                        f"for {len(ep_ranks)} ranks, {num_experts} experts over "
                                        f"ep_size {ep}; the ZeRO files are from {world} ranks")
        name = layer["name"]
        plan.append({"prefix": f"{name}.{EXPERTS_INFIX}" if name else EXPERTS_INFIX,
                     "ep_size": ep, "num_local": num_experts // ep,
                     "ep_ranks": [ep_ranks[r] for r in ranks],
                     "edp_ranks": [edp_ranks[r] for r in ranks], "ranks": ranks,
                     "tensor_replicas": int(layer.get("tensor_replicas", 1))})
    return plan


def join_tensor_replicas(plans, tp, temps):
    """Experts replicated over the ``tp`` tensor ranks of a stage (``tensor_replicas``) have
    their param groups partitioned over the *replica* group: the ranks of every tensor rank
    holding the same experts, in global-rank order (``deepspeed.moe.groups``). ``plans``: one
    per model-parallel rank (``stage * tp + tensor rank``), ``temps``: their fragment folders.
    Each such layer gets ``replica_world``, ``replica_ranks`` (the position of each of the
    rank's files in its replica group) and ``fragments_dir`` (the stage's tensor rank 0's
    folder, where every copy's fragments meet)."""
    for first in range(0, len(plans), tp):
        stage = plans[first:first + tp]
        for index, layer in enumerate(stage[0] or ()):
            if layer["tensor_replicas"] == 1:
                continue
            if layer["tensor_replicas"] != tp or any(
                    len(p or ()) <= index or p[index]["prefix"] != layer["prefix"]
                    for p in stage):
                raise CheckpointFormatError(
                    f"MoE layer '{layer['prefix']}' records experts replicated over "
                    f"{layer['tensor_replicas']} tensor ranks, the checkpoint has {tp} with "
                    f"other MoE layers on some of them; the files are from different saves")
            copies = {}  # expert-parallel rank -> global ranks holding those experts
            for entry in (p[index] for p in stage):
                for rank, ep_rank in zip(entry["ranks"], entry["ep_ranks"]):
                    copies.setdefault(ep_rank, []).append(rank)
            for entry in (p[index] for p in stage):
                groups = [sorted(copies[e]) for e in entry["ep_ranks"]]
                entry.update(replica_world=len(groups[0]), fragments_dir=temps[first],
                             replica_ranks=[g.index(r) for g, r in zip(groups, entry["ranks"])])
    return plans


def replica_jobs(plan, jobs, tensor_rank):
    """A model-parallel rank's merge jobs (``name -> job``, see ``ds_to_universal_phases``)
    for experts replicated over tensor ranks: tensor rank 0 merges them from the fragments of
    the whole replica group, the others not at all (the copies are one tensor)."""
    for name in list(jobs):
        layer = layer_of(plan or (), name)
        if layer is None or "replica_world" not in layer:
            continue
        if tensor_rank:
            del jobs[name]
        else:
            job = list(jobs[name])
            job[3] = layer["replica_world"]
            jobs[name] = tuple(job)
    return jobs


def global_entries(plan, entries):
    """A name-keyed mapping the model-states file records for its writer's local experts
    (``frozen_param_shapes``, ``param_slices``) under the global names of every expert: the
    writer (expert-data-parallel rank 0 of expert-parallel rank 0) holds local experts
    ``0..num_local-1``; every expert-parallel rank holds the same parameters of its own experts,
    so each local entry stands for ``ep_size`` global ones. Dense entries pass unchanged."""
    out = OrderedDict()
    for name, value in (entries or {}).items():
        layer = layer_of(plan, name) if plan else None
        if layer is None:
            out[name] = value
            continue
        for ep_rank in range(layer["ep_size"]):
            out[global_name(layer, name, ep_rank)] = value
    return out


def layout_free_hyper(hyper):
    """The param groups' hyperparameters without the expert groups' names (``ep_size_<n>``:
    the saved layout's, not the loading model's)."""
    return [{k: v for k, v in h.items() if not (h.get("moe") and k == "name")} for h in hyper]


def layer_of(plan, name):
    return next((layer for layer in plan if name.startswith(layer["prefix"])), None)


def global_name(layer, name, ep_rank):
    """A local expert parameter name of expert-parallel rank ``ep_rank`` under its global id."""
    local, rest = name[len(layer["prefix"]):].split(".", 1)
    return f"{layer['prefix']}{ep_rank * layer['num_local'] + int(local)}.{rest}"


def group_layer(plan, described):
    """The split layer whose experts a described param group holds (``None``: a dense group,
    partitioned over the data-parallel group). A group mixing them is refused, as ZeRO does."""
    names = [n for bucket in described for n in bucket["params"]]
    layers = [layer_of(plan, n) for n in names]
    if not names or layers[0] is None:
        if any(layer is not None for layer in layers):
            raise CheckpointFormatError(f"an optimizer param group mixes expert and dense "
                                        f"parameters ({names[:4]}...)")
        return None
    if any(layer is not layers[0] for layer in layers):
        raise CheckpointFormatError(f"an optimizer param group mixes the experts of several "
                                    f"MoE layers or dense parameters ({names[:4]}...)")
    return layers[0]


def group_placement(plan, described, world, rank):
    """``(world, rank, rename)`` of one rank file's described group."""
    layer = group_layer(plan, described) if plan else None
    if layer is None:
        return world, rank, lambda name: name
    ep_rank = layer["ep_ranks"][rank]
    if "replica_world" in layer:  # partitioned over the copies on every tensor rank
        return (layer["replica_world"], layer["replica_ranks"][rank],
                lambda name: global_name(layer, name, ep_rank))
    return (world // layer["ep_size"], layer["edp_ranks"][rank],
            lambda name: global_name(layer, name, ep_rank))


def fragment_place(plan, described, rank, temp_dir):
    """``(folder, file id)`` of one rank file's fragments of a described group: its own
    folder and data-parallel rank, or for experts replicated over tensor ranks the folder
    their copies share and the position in the replica group."""
    layer = group_layer(plan, described) if plan else None
    if layer is None or "replica_world" not in layer:
        return temp_dir, rank
    return layer["fragments_dir"], layer["replica_ranks"][rank]


def global_groups(plan, layout, groups):
    """The groups of rank 0's (local) names expanded to every expert's global name: an expert
    group holds the experts of every expert-parallel rank, in global-id order."""
    out = []
    for described, group in zip(layout, groups):
        layer = group_layer(plan, described) if plan else None
        if layer is None:
            out.append(group)
            continue
        expanded = OrderedDict()
        for ep_rank in range(layer["ep_size"]):
            for name, shape in group.items():
                expanded[global_name(layer, name, ep_rank)] = shape
        out.append(OrderedDict(sorted(expanded.items(), key=lambda item: _order(layer, item[0]))))
    return out


def _order(layer, name):
    return int(name[len(layer["prefix"]):].split(".", 1)[0])  # stable: keeps each expert's order
