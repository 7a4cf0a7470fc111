"""Mixture-of-experts inference: the ``moe`` settings of ``init_inference``.

Two kinds of MoE model meet here:

- ``deepspeed.moe.layer.MoE`` layers (the ``moe`` plugin's public layer): their experts are
  split over ``ep_size`` ranks (expert parallelism) by the layer itself. The engine checks that
  ``moe.ep_size`` / ``moe.moe_experts`` agree with the layers, starts the process group and has
  every layer build its groups (``MoE.set_deepspeed_parallelism``, public). Each rank's local
  experts are named in checkpoints by their global id (the layout of a state dict saved at
  ``ep_size=1``), so ``checkpoint=`` loads a full state dict into any ``ep_size``. AutoTP leaves
  the inside of these layers alone (the gate must score every expert). With ``ep_size=1`` and
  ``tp_size > 1`` (fewer experts than ranks) each expert is sliced over the tensor-parallel
  group instead (expert slicing: its first Linears by columns, its last by rows with an
  all-reduce). Without the ``moe`` plugin, ``moe.ep_size > 1`` is a clear error.
- Hugging Face sparse-MoE blocks whose experts are stacked 3-D weights (Mixtral's
  ``gate_up_proj [experts, 2 * inter, hidden]`` and ``down_proj [experts, hidden, inter]``):
  under AutoTP every expert is sliced along its intermediate size (expert slicing) and the
  block's output is all-reduced, like a column-parallel / row-parallel Linear pair.
"""
import importlib.util

import torch

from deepspeed import comm as dist
from deepspeed.tensor_parallel import (CHECKPOINT_KEY, frozen, mark, narrow_fn, shard_range,
                                       take_shard)



def _moe_layer_class():
    if importlib.util.find_spec("deepspeed.moe") is None:
        return None
    from deepspeed.moe import MoE

    return MoE


def moe_layers(model):
    """``[(name, layer)]`` of the ``deepspeed.moe.layer.MoE`` layers in ``model``."""
    cls = _moe_layer_class()
    if cls is None:
        return []
    return [(name, m) for name, m in model.named_modules() if isinstance(m, cls)]


def prepare_moe(model, moe):
    """Check ``moe`` (``DeepSpeedMoEConfig``) against the model's MoE layers and set up their
    expert-parallel groups; returns the names of the layers prepared."""
    asked_ep = moe.enabled and moe.ep_size > 1
    if _moe_layer_class() is None:
        if asked_ep:
            raise RuntimeError(f"moe.ep_size={moe.ep_size} asks for expert parallelism, which "
                               f"needs the 'moe' plugin (deepspeed.moe), not installed here; "
                               f"install it or leave moe.ep_size at 1")
        return []
    layers = moe_layers(model)
    if asked_ep and not layers:
        raise ValueError(f"moe.ep_size={moe.ep_size} but {type(model).__name__} has no "
                         f"deepspeed.moe.layer.MoE layer (Hugging Face experts such as "
                         f"Mixtral's are sliced by tensor_parallel.tp_size instead)")
    experts = list(moe.moe_experts)
    for i, (name, layer) in enumerate(layers):
        if moe.enabled and moe.type.value == "residual" and not getattr(layer, "use_residual",
                                                                         False):
            raise ValueError(f"moe.type=residual but MoE layer {name} was built without "
                             f"use_residual; build it with MoE(..., use_residual=True) or leave "
                             f"moe.type at standard")
        if asked_ep and layer.ep_size != moe.ep_size:
            raise ValueError(f"moe.ep_size={moe.ep_size} but MoE layer {name} was built with "
                             f"ep_size={layer.ep_size}; build the layers with "
                             f"MoE(..., ep_size={moe.ep_size}) or pass ep_size={layer.ep_size}")
        want = experts[i] if len(experts) == len(layers) else None
        if experts != [1] and want is None and layer.num_experts not in experts:
            raise ValueError(f"moe.moe_experts={experts} does not list the {layer.num_experts} "
                             f"experts of MoE layer {name}")
        if want is not None and experts != [1] and want != layer.num_experts:
            raise ValueError(f"moe.moe_experts[{i}]={want} but MoE layer {name} has "
                             f"{layer.num_experts} experts")
    if any(layer.ep_size > 1 for _, layer in layers):
        if not dist.is_initialized():
            dist.init_distributed(verbose=False)
        for name, layer in layers:
            layer.set_deepspeed_parallelism()
            _name_experts_globally(name, layer)
    return [name for name, _ in layers]


def _name_experts_globally(name, layer):
    """Tag each local expert's parameters with their key in a full (``ep_size=1``) state dict."""
    if layer.ep_size == 1:
        return
    ep_rank = layer.expert_parallel_rank()
    local = layer.num_local_experts
    prefix = f"{name}.deepspeed_moe.experts.deepspeed_experts."
    experts = layer.deepspeed_moe.experts.deepspeed_experts
    for i, expert in enumerate(experts):
        for pname, p in expert.named_parameters():
            setattr(p, CHECKPOINT_KEY, f"{prefix}{ep_rank * local + i}.{pname}")


def slice_experts(model, tp_size, rank, group):
    """Expert slicing of the ``ep_size=1`` MoE layers: in every expert, all Linears but the
    last split by output features, the last by input features (``LinearAllreduce``). An
    expert whose Linears do not read and write the hidden size stays whole. Returns the names
    of the experts sliced."""
    from deepspeed.tensor_parallel import shard_block

    sliced = []
    for name, layer in moe_layers(model):
        if layer.ep_size != 1:
            continue
        for i, expert in enumerate(layer.deepspeed_moe.experts.deepspeed_experts):
            linears = [(n, m) for n, m in expert.named_modules()
                       if isinstance(m, torch.nn.Linear)]
            if (len(linears) < 2 or linears[0][1].in_features != layer.hidden_size
                    or linears[-1][1].out_features != layer.hidden_size):
                continue
            where = f"{name}.deepspeed_moe.experts.deepspeed_experts.{i}"
            shard_block(expert, (linears[-1][0],), tp_size, rank, group, where=where)
            sliced.append(where)
    return sliced


def _is_stacked_experts(module):
    gate_up, down = getattr(module, "gate_up_proj", None), getattr(module, "down_proj", None)
    return (isinstance(gate_up, torch.nn.Parameter) and isinstance(down, torch.nn.Parameter)
            and gate_up.dim() == 3 and down.dim() == 3 and gate_up.shape[1] == 2 * down.shape[2])


def shard_stacked_experts(model, tp_size, rank, group):
    """Slice every expert of Mixtral-style stacked expert weights along its intermediate size
    and all-reduce the experts' output; returns the names of the modules split."""
    split = []
    for name, module in model.named_modules():
        if not _is_stacked_experts(module):
            continue
        inter = module.down_proj.shape[2]
        start, length = shard_range(inter, tp_size, rank)

        def take_gate_up(full, inter=inter, start=start, length=length):
            gate, up = full.narrow(1, 0, inter), full.narrow(1, inter, inter)
            return torch.cat([gate.narrow(1, start, length), up.narrow(1, start, length)], 1)

        take_down = narrow_fn(2, tp_size, rank)
        module.gate_up_proj = mark(frozen(take_gate_up(module.gate_up_proj.data).clone()),
                                   take_gate_up)
        module.down_proj = mark(frozen(take_shard(module.down_proj.data, take_down)), take_down)
        if isinstance(getattr(module, "intermediate_dim", None), int):
            module.intermediate_dim = length

        def all_reduce(_module, _inputs, output, group=group):
            dist.inference_all_reduce(output, group=group)
            return output

        module.register_forward_hook(all_reduce)
        split.append(name)
    return split
