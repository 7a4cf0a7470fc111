"""The gate (``TopKGate``) and the token exchange (``MOELayer``) of a mixture-of-experts layer.

``MOELayer`` sends each token to the rank that owns its expert and brings the expert's output
back, both with one ``all_to_all_single`` over the expert-parallel group:

    tokens [S, M] --gate--> dispatch [E, C, M] --all-to-all--> [ep, local, C, M] --experts-->
    [ep, local, C, M] --all-to-all--> [E, C, M] --combine--> [S, M]

Dispatch and combine go by index (``dispatch_by_index``, ``combine_by_index``) from the
gate's per-token routing (expert, slot, weight of each choice): ``O(k x S x M)`` copies where
upstream's one-hot einsums over the ``[S, E, C]`` masks cost ``S x E x C x M`` multiply-adds
each (quadratic in tokens, ``C ~ S / E``); the results and gradients are the einsums'.

``E = ep * local`` experts, ``C`` slots each. Every rank sends every other rank the same
``local * C * M`` elements, so each all-to-all moves ``E * C * M * dtype size`` bytes per rank
(``capacity * hidden * experts-per-rank * ep_size * dtype size``). The routing arithmetic lives
in ``gating`` (re-exported here under upstream's names).
"""
import importlib.util

import torch
import torch.nn.functional as F
from torch import nn

from deepspeed import comm as dist
from deepspeed.moe import gating, mappings
from deepspeed.moe.gating import capacity, gumbel_rsample, multiplicative_jitter
from deepspeed.utils.logging import logger

__all__ = ["TopKGate", "MOELayer", "top1gating", "top2gating", "gumbel_rsample",
           "multiplicative_jitter", "capacity", "NOISY_GATE_POLICIES"]

NOISY_GATE_POLICIES = ("Jitter", "RSample", "None", None)
_TUTEL_NOTED = False


def tutel_available():
    return importlib.util.find_spec("tutel") is not None


def _note_tutel_fallback():
    """``use_tutel=True`` asks for Tutel's fused dispatch, which this implementation does not
    ship; the built-in index dispatch computes the same thing (upstream's einsum dispatch).
    Said once per process."""
    global _TUTEL_NOTED
    if not _TUTEL_NOTED:
        _TUTEL_NOTED = True
        reason = ("Tutel is not installed" if not tutel_available()
                  else "Tutel's fused kernels are not used by this implementation")
        logger.info(f"MoE use_tutel=True: {reason}; using the built-in index dispatch "
                    f"(the result of upstream's einsum dispatch) instead")


def _max_over(ep_group, device):
    """Without token dropping every rank needs the busiest expert's slot count, agreed by a
    MAX over the expert-parallel group so that all exchanged blocks have one size."""

    def agree(local):
        if ep_group is None or dist.get_world_size(group=ep_group) == 1:
            return local
        agreed = torch.tensor([local], dtype=torch.int64, device=device)
        dist.all_reduce(agreed, op=dist.ReduceOp.MAX, group=ep_group)
        return int(agreed.item())

    return agree


def top1gating(logits, capacity_factor, min_capacity, used_token=None, noisy_gate_policy=None,
               drop_tokens=True, use_rts=True, ep_group=None, use_tutel=False):
    """Upstream's signature over ``gating.top1gating``; ``ep_group`` agrees on the capacity
    when tokens are not dropped."""
    return gating.top1gating(logits, capacity_factor, min_capacity, used_token, noisy_gate_policy,
                             drop_tokens, use_rts, _max_over(ep_group, logits.device))


def top2gating(logits, capacity_factor, min_capacity, drop_tokens=True, ep_group=None,
               top2_2nd_expert_sampling=True, used_token=None):
    """Upstream's signature over ``gating.top2gating`` (``used_token`` is an addition)."""
    return gating.top2gating(logits, capacity_factor, min_capacity, used_token, drop_tokens,
                             top2_2nd_expert_sampling, _max_over(ep_group, logits.device))


class _AllToAll(torch.autograd.Function):
    """An even all-to-all over ``group`` that autograd can run through: chunk ``i`` of dim 0
    goes to rank ``i``. Its backward is the same exchange (the transpose of a block
    permutation), which returns each gradient chunk to the rank that sent the value."""

    @staticmethod
    def forward(ctx, group, tensor):
        ctx.group = group
        tensor = tensor.contiguous()
        output = torch.empty_like(tensor)
        dist.all_to_all_single(output, tensor, group=group)
        return output

    @staticmethod
    def backward(ctx, grad_output):
        return None, _AllToAll.apply(ctx.group, grad_output.contiguous())


class TopKGate(nn.Module):
    """``Linear(model_dim -> num_experts, bias=False)`` in fp32 followed by top-1 or top-2
    gating. ``eval()`` switches to ``eval_capacity_factor``; the noise of 'Jitter' and
    'RSample' is only applied in training."""

    def __init__(self, model_dim, num_experts, k=1, capacity_factor=1.0, eval_capacity_factor=1.0,
                 min_capacity=8, noisy_gate_policy=None, drop_tokens=True, use_rts=True,
                 ep_group=None, top2_2nd_expert_sampling=True):
        super().__init__()
        if k not in (1, 2):
            raise ValueError("Only top-1 and top-2 gatings are supported.")
        check_noisy_gate_policy(noisy_gate_policy)
        self.wg = nn.Linear(model_dim, num_experts, bias=False).float()
        self.model_dim, self.num_experts, self.k = model_dim, num_experts, k
        self.capacity_factor = capacity_factor
        self.eval_capacity_factor = eval_capacity_factor
        self.min_capacity = min_capacity
        self.noisy_gate_policy = None if noisy_gate_policy == "None" else noisy_gate_policy
        self.drop_tokens = drop_tokens
        self.use_rts = use_rts
        self.top2_2nd_expert_sampling = top2_2nd_expert_sampling
        self.ep_group = ep_group

    def _set_ep_group(self, ep_group):
        assert self.ep_group is None, "attempting to override an existing ep_group"
        self.ep_group = ep_group

    def forward(self, input, used_token=None, use_tutel=False):
        if input.shape[-1] != self.model_dim:
            raise ValueError(f"MoE gate expects hidden size {self.model_dim}, got input of shape "
                             f"{tuple(input.shape)}")
        tokens = input.float()
        if self.noisy_gate_policy == "Jitter" and self.training:
            tokens = multiplicative_jitter(tokens)
        logits = F.linear(tokens, self.wg.weight.float())
        factor = self.capacity_factor if self.training else self.eval_capacity_factor
        if self.k == 1:
            return top1gating(logits, factor, self.min_capacity, used_token,
                              self.noisy_gate_policy if self.training else None,
                              self.drop_tokens, self.use_rts, self.ep_group)
        return top2gating(logits, factor, self.min_capacity, self.drop_tokens, self.ep_group,
                          self.top2_2nd_expert_sampling, used_token)


def check_noisy_gate_policy(policy):
    if policy not in NOISY_GATE_POLICIES:
        raise AssertionError(f"Unsupported noisy_gate_policy {policy!r}: use 'Jitter', 'RSample', "
                             f"'None' or None")


def dispatch_by_index(tokens, routing, num_experts, slots):
    """``[E, C, M]`` expert inputs: each kept (token, choice) copied into its (expert, slot),
    zeros in the unused slots. Equals ``einsum("sec,sm->ecm", dispatch_mask, tokens)``, and so
    does its backward (each token's gradient is the sum of its kept slots' gradients), at the
    cost of one ``[k*S, M]`` copy instead of ``S x E x C x M`` multiply-adds. The dropped
    choices are written to one spare row past the end, which is cut off (no gradient)."""
    num_choices, num_tokens = routing.weights.shape
    d_model = tokens.shape[-1]
    num_slots = num_experts * slots
    kept = routing.weights.detach() != 0
    index = torch.where(kept, routing.experts * slots + routing.locations,
                        torch.full_like(routing.experts, num_slots))
    source = tokens if num_choices == 1 else tokens.repeat(num_choices, 1)
    dispatched = tokens.new_zeros(num_slots + 1, d_model).index_copy(0, index.reshape(-1), source)
    return dispatched[:num_slots].reshape(num_experts, slots, d_model)


def combine_by_index(expert_out, routing):
    """``[S, M]``: each token's kept slots of ``expert_out`` ``[E, C, M]``, weighted by their
    combine weights and summed. Equals ``einsum("sec,ecm->sm", combine_weights, expert_out)``
    with its gradients to ``expert_out`` and to the weights (hence to the gate), gathering
    ``k*S`` rows instead of ``S x E x C x M`` multiply-adds. A dropped choice reads slot 0
    of its expert with weight exactly 0."""
    num_experts, slots, d_model = expert_out.shape
    num_choices, num_tokens = routing.weights.shape
    kept = routing.weights.detach() != 0
    index = torch.where(kept, routing.experts * slots + routing.locations,
                        torch.zeros_like(routing.experts))
    picked = expert_out.reshape(num_experts * slots, d_model).index_select(0, index.reshape(-1))
    picked = picked.reshape(num_choices, num_tokens, d_model)
    weighted = picked * routing.weights.to(expert_out.dtype).unsqueeze(-1)
    return weighted[0] if num_choices == 1 else weighted.sum(dim=0)


def routing_from_masks(combine_weights, dispatch_mask):
    """``gating.Routing`` read off ``[S, E, C]`` masks, for a gate that returns only
    upstream's 4-tuple: the up-to-k (expert, slot) pairs of each token, k the most any token
    uses, with their weights gathered from ``combine_weights`` (keeping the gradient)."""
    num_tokens, num_experts, slots = combine_weights.shape
    flat_mask = dispatch_mask.reshape(num_tokens, num_experts * slots)
    num_choices = max(int(flat_mask.sum(dim=1).max()) if num_tokens else 0, 1)
    flat = torch.topk(flat_mask.float(), k=num_choices, dim=1).indices  # kept slots first
    weights = combine_weights.reshape(num_tokens, -1).gather(1, flat)
    weights = weights * flat_mask.gather(1, flat).to(weights.dtype)
    flat = flat.t()
    return gating.Routing(flat // slots, flat % slots, weights.t())


class MOELayer(nn.Module):
    """Gate, dispatch to the experts' ranks, run the local experts, bring the outputs back and
    mix them by gate weight. Keeps the last forward's ``l_aux`` and ``exp_counts``.

    With tensor parallelism and experts that are not tensor parallel, every tensor-parallel
    rank gates the same tokens (the same ``l_aux``), sends only its slice of the slots through
    the experts and gathers the slices back before the combine (``deepspeed.moe.mappings``);
    with tensor-parallel experts every rank sends all slots and the expert reduces itself."""

    def __init__(self, gate, experts, ep_group_name, ep_size, num_local_experts, use_tutel=False):
        super().__init__()
        self.gate = gate
        self.experts = experts
        self.ep_group = None
        self.ep_size = ep_size
        self.ep_group_name = ep_group_name
        self.num_local_experts = num_local_experts
        self.tp_group, self.tp_size = None, 1  # set when experts are replicated over TP ranks
        self.l_aux = None
        self.exp_counts = None
        self.use_tutel = False
        if use_tutel:
            _note_tutel_fallback()

    def _set_ep_group(self, ep_group):
        """(Re)point the layer and its gate at ``ep_group``: a layer rebuilds its groups when
        another model-parallel unit is registered."""
        self.ep_group = ep_group
        if getattr(self.gate, "ep_group", None) is None:
            self.gate._set_ep_group(ep_group)
        else:
            self.gate.ep_group = ep_group

    def _set_tp_group(self, tp_group, tp_size):
        """Experts replicated over ``tp_size`` tensor-parallel ranks holding the same tokens:
        each rank sends only its ``1/tp`` slice of the slots through them (None: all)."""
        self.tp_group, self.tp_size = (tp_group, tp_size) if tp_size > 1 else (None, 1)

    def _keep_own_slots(self, dispatched):
        """``[E, C, M]`` -> this tensor-parallel rank's ``[E, C'/tp, M]``, ``C`` padded with
        empty slots to ``C'``, a multiple of ``tp`` (the padding is cut off again after the
        gather, so it never reaches a token)."""
        if self.tp_group is None:
            return dispatched
        pad = -dispatched.shape[1] % self.tp_size
        if pad:
            dispatched = torch.cat([dispatched, dispatched.new_zeros(
                dispatched.shape[0], pad, dispatched.shape[2])], dim=1)
        return mappings.drop_tokens(dispatched, dim=1, group=self.tp_group)

    def _gather_slots(self, expert_out, slots):
        if self.tp_group is None:
            return expert_out
        return mappings.gather_tokens(expert_out, dim=1, group=self.tp_group)[:, :slots]

    def _exchange(self, tensor):
        if self.ep_size == 1:
            return tensor
        return _AllToAll.apply(self.ep_group, tensor)

    def forward(self, *input, **kwargs):
        hidden = input[0]
        used_token = input[1] if len(input) > 1 else kwargs.get("used_token")
        d_model = hidden.shape[-1]
        tokens = hidden.reshape(-1, d_model)
        if used_token is not None:
            used_token = used_token.reshape(-1)
            if used_token.numel() != tokens.shape[0]:
                raise ValueError(f"used_token has {used_token.numel()} entries for "
                                 f"{tokens.shape[0]} tokens (input shape {tuple(hidden.shape)})")
        gated = self.gate(tokens, used_token)
        self.l_aux, combine_weights, dispatch_mask, self.exp_counts = gated
        routing = getattr(gated, "routing", None)
        if routing is None:  # a gate of upstream's 4-tuple: read the routing off the masks
            routing = routing_from_masks(combine_weights, dispatch_mask)
        slots = combine_weights.shape[2]
        dispatched = dispatch_by_index(tokens, routing, combine_weights.shape[1], slots)
        dispatched = self._exchange(self._keep_own_slots(dispatched))
        # [ep (source ranks), local experts, C, M]: the experts run on dim 1
        expert_in = dispatched.reshape(self.ep_size, self.num_local_experts, -1, d_model)
        expert_out = self.experts(expert_in)
        expert_out = self._exchange(expert_out.contiguous())
        expert_out = expert_out.reshape(self.ep_size * self.num_local_experts, -1, d_model)
        expert_out = self._gather_slots(expert_out, slots)
        combined = combine_by_index(expert_out, routing)
        return combined.reshape(hidden.shape)
