"""Top-1 and top-2 gating: which expert (and which capacity slot) each token goes to.

Both return ``(l_aux, combine_weights, dispatch_mask, exp_counts)`` over ``S`` tokens, ``E``
experts and ``C`` capacity slots: ``combine_weights[s, e, c]`` is the gate weight with which
token ``s``, placed in slot ``c`` of expert ``e``, mixes that expert's output back into its own,
and ``dispatch_mask`` is its non-zero pattern. The same routing, one entry per token and per
choice, rides along as ``.routing`` of the returned tuple (``GateOutput``): ``MOELayer``
dispatches and combines by index from it, in ``O(S x M)`` rather than the ``O(S x E x C x M)``
of one-hot einsums over the masks. Kept apart from the dispatch (``sharded_moe``)
because this part is pure tensor arithmetic, testable without any process group; the only
collective, the MAX of the capacity without token dropping, is done by the caller's
``max_capacity`` function.
"""
import math
from collections import namedtuple

import torch
import torch.nn.functional as F

# numerical floor of the top-2 normalisation (two near-zero gate values)
_EPS = torch.finfo(torch.float32).eps


# Per choice (top-1: 1, top-2: 2) and token, each [k, S]: the expert chosen, the capacity slot
# in it, and the combine weight (differentiable; exactly ``combine_weights[s, expert, slot]``,
# so it is 0 where the token was dropped or masked and ``weights != 0`` is ``dispatch_mask``
# at that (expert, slot)). ``experts``/``locations`` of a dropped choice are meaningless.
Routing = namedtuple("Routing", ["experts", "locations", "weights"])


class GateOutput(tuple):
    """``(l_aux, combine_weights, dispatch_mask, exp_counts)``, unpacking as upstream's gate
    output does, with the per-token ``Routing`` as ``.routing``."""

    def __new__(cls, l_aux, combine_weights, dispatch_mask, exp_counts, routing):
        out = super().__new__(cls, (l_aux, combine_weights, dispatch_mask, exp_counts))
        out.routing = routing
        return out


def capacity(num_tokens, num_experts, capacity_factor, min_capacity):
    """Slots per expert: ``max(ceil(tokens / experts * factor), min_capacity)``."""
    return max(int(math.ceil(num_tokens / num_experts * capacity_factor)), int(min_capacity))


def multiplicative_jitter(x, epsilon=1e-2):
    """'Jitter' noise: scale the gate's input by U(1 - eps, 1 + eps) (Switch Transformer)."""
    if epsilon == 0:
        return x
    noise = torch.empty_like(x).uniform_(1.0 - epsilon, 1.0 + epsilon)
    return x * noise


def gumbel_rsample(shape, device):
    """Gumbel(0, 1) samples: argmax(logits + g) samples from softmax(logits)."""
    uniform = torch.rand(shape, device=device).clamp(min=1e-20, max=1.0 - 1e-7)
    return -torch.log(-torch.log(uniform))


def _keep_within_capacity(mask, slots, use_rts):
    """Drop the routed tokens beyond ``slots`` per expert. Random Token Selection keeps a random
    subset (priority ``mask * U(0, 1)``), so no position in the sequence is favoured; without
    it the first tokens in order are kept."""
    if not use_rts:
        return mask * (torch.cumsum(mask, dim=0) - 1 < slots).to(mask.dtype)
    priority = mask * torch.rand(mask.shape, device=mask.device)
    top = torch.topk(priority, k=min(slots, mask.shape[0]), dim=0).indices
    return mask * torch.zeros_like(mask).scatter_(0, top, 1)


def _combine(gates_s, mask, locations_s, slots):
    """``[S, E, C]`` weights of one choice: gate value at (expert, slot) of each routed token."""
    gates = gates_s.unsqueeze(1) * mask.to(gates_s.dtype)
    slot_onehot = F.one_hot(locations_s, num_classes=slots).to(gates.dtype)
    return torch.einsum("se,sc->sec", gates, slot_onehot)


def top1gating(logits, capacity_factor, min_capacity, used_token=None, noisy_gate_policy=None,
               drop_tokens=True, use_rts=True, max_capacity=None):
    """Route each token to its most probable expert.

    ``l_aux = E * sum_e mean_s(gates[s, e]) * fraction of tokens routed to e`` (1.0 for
    uniform gates); ``exp_counts`` counts the routed tokens before any is dropped.
    ``max_capacity(int) -> int`` agrees on a capacity across the expert-parallel ranks when
    tokens are not dropped (every rank must exchange slots of the same size)."""
    gates = F.softmax(logits, dim=1)
    num_tokens, num_experts = gates.shape
    choose_from = gates
    if noisy_gate_policy == "RSample":
        choose_from = logits + gumbel_rsample(logits.shape, device=logits.device)
    indices1_s = torch.argmax(choose_from, dim=1)
    mask1 = F.one_hot(indices1_s, num_classes=num_experts).to(gates.dtype)
    if used_token is not None:
        mask1 = mask1 * used_token.reshape(-1, 1).to(mask1.dtype)
    exp_counts = mask1.sum(dim=0).detach().to(device="cpu", dtype=torch.int64)

    l_aux = torch.sum(gates.mean(dim=0) * mask1.mean(dim=0)) * num_experts

    if drop_tokens:
        slots = capacity(num_tokens, num_experts, capacity_factor, min_capacity)
        mask1 = _keep_within_capacity(mask1, slots, use_rts)
    else:  # every token keeps its place: as many slots as the busiest expert needs
        slots = max(int(exp_counts.max()), 1)
        slots = max_capacity(slots) if max_capacity is not None else slots
    locations1_s = ((torch.cumsum(mask1, dim=0) - 1) * mask1).sum(dim=1).to(torch.int64)
    gates1_s = (gates * mask1).sum(dim=1)
    combine_weights = _combine(gates1_s, mask1, locations1_s, slots)
    routing = Routing(indices1_s.unsqueeze(0), locations1_s.unsqueeze(0), gates1_s.unsqueeze(0))
    return GateOutput(l_aux, combine_weights, combine_weights.bool(), exp_counts, routing)


def top2gating(logits, capacity_factor, min_capacity, used_token=None, drop_tokens=True,
               top2_2nd_expert_sampling=True, max_capacity=None):
    """Route each token to its two best experts (the second sampled by Gumbel-max when
    ``top2_2nd_expert_sampling``); capacity uses twice the factor, the pair of gate values is
    renormalised to sum to 1 over the kept choices, ``l_aux = mean_e(me * ce) * E * E`` and
    ``exp_counts`` counts both choices before dropping."""
    gates = F.softmax(logits, dim=1)
    num_tokens, num_experts = gates.shape
    indices1_s = torch.argmax(gates, dim=1)
    mask1 = F.one_hot(indices1_s, num_classes=num_experts).to(gates.dtype)
    second_from = logits
    if top2_2nd_expert_sampling:
        second_from = logits + gumbel_rsample(logits.shape, device=logits.device)
    second_from = second_from.masked_fill(mask1.bool(), float("-inf"))
    indices2_s = torch.argmax(second_from, dim=1)
    mask2 = F.one_hot(indices2_s, num_classes=num_experts).to(gates.dtype)
    if used_token is not None:
        used = used_token.reshape(-1, 1).to(mask1.dtype)
        mask1, mask2 = mask1 * used, mask2 * used

    # the second choices queue behind every first choice of the same expert
    locations1 = torch.cumsum(mask1, dim=0) - 1
    locations2 = torch.cumsum(mask2, dim=0) - 1 + mask1.sum(dim=0, keepdim=True)
    exp_counts = (mask1 + mask2).sum(dim=0).detach().to(device="cpu", dtype=torch.int64)

    l_aux = torch.mean(gates.mean(dim=0) * mask1.mean(dim=0)) * num_experts * num_experts

    if drop_tokens:
        slots = capacity(num_tokens, num_experts, 2 * capacity_factor, min_capacity)
        mask1 = mask1 * (locations1 < slots).to(mask1.dtype)
        mask2 = mask2 * (locations2 < slots).to(mask2.dtype)
    else:
        slots = max(int(exp_counts.max()), 1)
        slots = max_capacity(slots) if max_capacity is not None else slots
    locations1_s = (locations1 * mask1).sum(dim=1).to(torch.int64)
    locations2_s = (locations2 * mask2).sum(dim=1).to(torch.int64)

    gates1_s = (gates * mask1).sum(dim=1)
    gates2_s = (gates * mask2).sum(dim=1)
    denom_s = torch.clamp(gates1_s + gates2_s, min=_EPS)
    weights1_s, weights2_s = gates1_s / denom_s, gates2_s / denom_s
    combine_weights = (_combine(weights1_s, mask1, locations1_s, slots)
                       + _combine(weights2_s, mask2, locations2_s, slots))
    routing = Routing(torch.stack([indices1_s, indices2_s]),
                      torch.stack([locations1_s, locations2_s]),
                      torch.stack([weights1_s, weights2_s]))
    return GateOutput(l_aux, combine_weights, combine_weights.bool(), exp_counts, routing)
