"""Shared pieces of the MoE tests: a tiny expert, copying the weights of a single-process
reference layer (all experts) into an expert-parallel one (this rank's experts), the tiny
model trained through the engine, its data, its single-process reference training and the
names of its experts under the reference's (global) expert ids."""
import torch
from torch import nn

HIDDEN = 8
MICRO = 6  # micro-batch size of ``global_batches``
# TinyMoEModel's expert parameters: ``<EXPERTS_PREFIX><expert index>.<key>``
EXPERTS_PREFIX = "moe.deepspeed_moe.experts.deepspeed_experts."


def expert(hidden=HIDDEN, inner=16):
    return nn.Sequential(nn.Linear(hidden, inner), nn.ReLU(), nn.Linear(inner, hidden))


def local_expert_range(layer, rank_in_ep_group):
    start = rank_in_ep_group * layer.num_local_experts
    return range(start, start + layer.num_local_experts)


def load_from_reference(layer, reference, rank_in_ep_group):
    """Give ``layer`` (expert parallel) ``reference``'s gate, dense parts and the experts this
    rank owns; ``reference`` holds all experts (ep_size 1)."""
    own = dict(reference.state_dict())
    prefix = "deepspeed_moe.experts.deepspeed_experts."
    mine = {}
    for local, global_idx in enumerate(local_expert_range(layer, rank_in_ep_group)):
        for key, value in own.items():
            if key.startswith(f"{prefix}{global_idx}."):
                mine[f"{prefix}{local}." + key[len(f"{prefix}{global_idx}."):]] = value
    for key, value in own.items():
        if not key.startswith(prefix):
            mine[key] = value
    layer.load_state_dict(mine)


class TinyMoEModel(nn.Module):
    """Linear -> MoE -> Linear; returns (prediction, l_aux)."""

    def __init__(self, ep_size=1, num_experts=4, k=1, drop_tokens=True, use_residual=False,
                 inp=4, out=3):
        super().__init__()
        from deepspeed.moe.layer import MoE

        self.inp = nn.Linear(inp, HIDDEN)
        self.moe = MoE(HIDDEN, expert(), num_experts=num_experts, ep_size=ep_size, k=k,
                       capacity_factor=1.0, min_capacity=2, drop_tokens=drop_tokens,
                       use_rts=False, top2_2nd_expert_sampling=False, use_residual=use_residual)
        self.out = nn.Linear(HIDDEN, out)

    def forward(self, x):
        h, l_aux, _ = self.moe(torch.tanh(self.inp(x)))
        return self.out(h), l_aux


def loss_of(model, x, y, coeff=0.01):
    pred, l_aux = model(x)
    return nn.functional.mse_loss(pred, y) + coeff * l_aux


def model_params_from_reference(model, reference, rank_in_ep_group):
    """Load a TinyMoEModel (any ep_size) from a reference TinyMoEModel (ep_size 1)."""
    load_from_reference(model.moe, reference.moe, rank_in_ep_group)
    model.inp.load_state_dict(reference.inp.state_dict())
    model.out.load_state_dict(reference.out.state_dict())


def moe_param_groups(model):
    """The model's parameters split into a dense group and one group per expert-parallel size,
    as the engine needs them (frozen ones left out: the optimizer holds none)."""
    from deepspeed.moe.utils import split_params_into_different_moe_groups_for_optimizer

    return split_params_into_different_moe_groups_for_optimizer(
        {"params": [p for p in model.parameters() if p.requires_grad], "name": "parameters"})


def ep_model(ep_size, seed=0, **model_kwargs):
    """``(model, ep_rank)``: a TinyMoEModel at ``ep_size`` holding the weights (this rank's
    experts) of the ep-1 reference built after ``manual_seed(seed)``, whatever the layout."""
    from deepspeed.utils import groups

    torch.manual_seed(seed)
    reference = TinyMoEModel(ep_size=1, **model_kwargs)
    model = TinyMoEModel(ep_size=ep_size, **model_kwargs)
    ep_rank = groups._get_expert_parallel_rank(model.moe.expert_group_name) if ep_size > 1 else 0
    model_params_from_reference(model, reference, ep_rank)
    return model, ep_rank


def global_expert_name(name, first_expert):
    """A TinyMoEModel parameter's name under the ep-1 model's names: local expert ``i`` of a
    rank whose first expert is ``first_expert`` is global expert ``first_expert + i``."""
    if not name.startswith(EXPERTS_PREFIX):
        return name
    local, rest = name[len(EXPERTS_PREFIX):].split(".", 1)
    return f"{EXPERTS_PREFIX}{first_expert + int(local)}.{rest}"


def global_batches(world, gas, steps=3, micro=MICRO, inp=4, out=3, seed=3):
    """``[step][rank][micro-batch] -> (x, y)`` for TinyMoEModel's default sizes."""
    g = torch.Generator().manual_seed(seed)
    return [[[(torch.randn(micro, inp, generator=g), torch.randn(micro, out, generator=g))
              for _ in range(gas)] for _ in range(world)] for _ in range(steps)]


def train_reference(data, lr, clip=0.0, **model_kwargs):
    """The single-process reference (ep 1, every expert) trained with SGD on ``global_batches``:
    each step averages the shards' losses, every shard routed on its own as on its rank, and
    clips the gradients at ``clip`` when given. Returns ``(model, per-step mean loss,
    per-step gradient norm before clipping)``."""
    torch.manual_seed(0)
    model = TinyMoEModel(ep_size=1, **model_kwargs)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    losses, norms = [], []
    for step in data:
        shards = [pair for rank in step for pair in rank]
        opt.zero_grad()
        total = 0.0
        for x, y in shards:
            loss = loss_of(model, x, y)
            (loss / len(shards)).backward()
            total += loss.item()
        if clip:
            norms.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), clip)))
        opt.step()
        losses.append(total / len(shards))
    return model, losses, norms
