"""Shared pieces of the MoE tests: a tiny expert, copying the weights of a single-process
reference layer (all experts) into an expert-parallel one (this rank's experts), and the
tiny model trained through the engine."""
import torch
from torch import nn

HIDDEN = 8


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
