"""Bytes each collective moves per training step on one rank, and what that costs in time.

Sizes are spelled the way ``deepspeed.comm`` reports them to the comms logger (the message
size of ``reduce_scatter_tensor`` is its output, of ``all_gather_into_tensor`` its input, of
``all_reduce`` the tensor), so a plan can be checked against a logged run byte for byte.

The data-parallel part mirrors how our engine cuts its traffic: stage 0 all-reduces every
gradient in one flat buffer; stages 1 and 2 reduce-scatter buckets of at most
``reduce_bucket_size`` elements (filled in reverse parameter order, each padded to a multiple
of ``dp``) and all-gather the updated pieces (in chunks when a bucket exceeds
``allgather_bucket_size``); stage 3 keeps parameters below ``stage3_param_persistence_threshold``
elements whole (one all-gather refreshes them after the step) and gathers each other
parameter's shards before its forward and again before its backward, then reduce-scatters
runs of shards. Model-parallel traffic follows the published schemes: Megatron tensor
parallelism (two all-reduces of the layer output per layer and direction), our pipeline
engine's p2p of one activation per micro-batch and direction plus its per-step status and loss
messages, MoE's two all-to-alls per expert layer and
direction, Ulysses' four all-to-alls per attention layer and direction.
"""
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Dict, List

from deepspeed.plan.cluster import Cluster
from deepspeed.plan.layout import Layout
from deepspeed.plan.memory import BYTES_PER_PARAM, shard_numels
from deepspeed.plan.model_spec import ModelSpec


@dataclass
class Collective:
    """One kind of collective over one group: ``{logged size in bytes: calls}``, the comms
    logger's own shape."""
    name: str
    group: str  # "data", "tensor", "pipe", "expert", "expert_data", "sequence"
    group_size: int
    sizes: Counter = field(default_factory=Counter)

    def add(self, size: int, calls: int = 1) -> "Collective":
        self.sizes[size] += calls
        return self

    @property
    def calls(self) -> int:
        return sum(self.sizes.values())

    @property
    def bytes(self) -> int:
        return sum(size * calls for size, calls in self.sizes.items())

    def wire_bytes(self) -> float:
        """Bytes one rank sends on the wire for these calls with ring algorithms (what the
        link bandwidth divides)."""
        n = self.group_size
        if n <= 1:
            return 0.0
        if self.name == "all_reduce":
            return self.bytes * 2 * (n - 1) / n
        if self.name in ("reduce_scatter_tensor", "all_gather_into_tensor"):
            return self.bytes * (n - 1)  # logged size is one rank's piece
        if self.name == "all_to_all_single":
            return self.bytes * (n - 1) / n
        return float(self.bytes)  # send / recv


def _pack(sizes, limit):
    """Runs of at most ``limit`` elements: the engine's own bucket rule, on plain sizes."""
    # imported here: its module holds ZeRO's tensor buckets (torch), and the launcher loads this
    # plugin for its flags without torch
    from deepspeed.zero import bucket_runs

    return bucket_runs(sizes, limit, size=lambda n: n, kind=lambda n: None)


def data_parallel(spec: ModelSpec, layout: Layout) -> List[Collective]:
    """Gradient reduction and ZeRO's gathers over the ranks holding the same weights (data
    and sequence parallel: ``layout.zero_ranks``)."""
    n = layout.zero_ranks
    if n == 1:
        return []
    wb, gb, _ = BYTES_PER_PARAM[layout.precision]
    numels = shard_numels(spec, layout)
    stage = layout.zero_stage
    if stage == 0:
        experts = expert_numel(spec, layout)
        found = [Collective("all_reduce", "data", n).add((sum(numels) - experts) * gb)]
        if experts:  # summed over the ranks holding the same experts (logged at size 1 too)
            found.append(Collective("all_reduce", "expert_data", n // layout.ep).add(experts * gb))
        return found
    if stage in (1, 2):
        reduce = Collective("reduce_scatter_tensor", "data", n)
        gather = Collective("all_gather_into_tensor", "data", n)
        for run in _pack(list(reversed(numels)), max(layout.reduce_bucket_size, 1)):
            padded = -(-max(sum(run), 1) // n) * n
            piece = padded // n
            reduce.add(piece * gb)
            if padded <= max(layout.allgather_bucket_size, 1):
                gather.add(piece * wb)
            else:
                per_rank = max(max(layout.allgather_bucket_size, 1) // n, 1)
                whole, rest = divmod(piece, per_rank)
                gather.add(per_rank * wb, whole)
                if rest:
                    gather.add(rest * wb)
        found = [reduce, gather]
        if layout.precision == "fp16":  # the ranks agree on an overflow: one fp32 flag, MAX
            found.append(Collective("all_reduce", "data", layout.world_size).add(4))
        return found
    shards = [-(-max(numel, 1) // n) for numel in numels]
    gather = Collective("all_gather_into_tensor", "data", n)
    persistent = [s for s, numel in zip(shards, numels) if numel < layout.param_persistence_threshold]
    gathered = [s for s, numel in zip(shards, numels) if numel >= layout.param_persistence_threshold]
    # one gather per parameter: the engine gathers a module's parameters in one call, so the
    # bytes agree always and the call counts when each module has one gathered parameter
    for shard in gathered:  # before each forward, again before each backward
        gather.add(shard * wb, 2 * layout.grad_accum)
    if persistent:
        gather.add(sum(persistent) * wb)  # the post-step refresh
    reduce = Collective("reduce_scatter_tensor", "data", n)
    for run in _pack([s * n for s in reversed(shards)], max(layout.reduce_bucket_size, 1)):
        reduce.add(sum(run) // n * gb)
    return [c for c in (gather, reduce) if c.sizes]


def expert_numel(spec: ModelSpec, layout: Layout) -> int:
    """Expert elements on one rank when experts are split over ranks (their gradients are
    reduced apart from the dense ones, over the expert-data-parallel group); 0 otherwise."""
    if layout.ep == 1 or not spec.expert_params:
        return 0
    return spec.expert_params // (layout.model_parallel * layout.ep)


def expert_slots(spec: ModelSpec, tokens: int) -> int:
    """Slots the gate gives all experts of a layer for ``tokens`` tokens: ``capacity`` each,
    ``max(ceil(tokens / experts * k * capacity_factor), min_capacity)`` (top-2 doubles the
    factor), whatever number of tokens was routed (the empty slots travel too)."""
    from deepspeed.moe import capacity

    factor = spec.capacity_factor * spec.experts_per_token
    return spec.num_experts * capacity(tokens, spec.num_experts, factor, spec.min_capacity)


def model_parallel(spec: ModelSpec, layout: Layout) -> List[Collective]:
    """Tensor, pipeline, expert and sequence traffic per step (formulas of the published
    schemes; the activation dtype is the precision's)."""
    act_bytes = BYTES_PER_PARAM[layout.precision][0]
    micro = layout.grad_accum
    tokens = layout.micro_batch * spec.seq_len // layout.sp
    hidden = tokens * spec.hidden_size * act_bytes
    layers = max(spec.num_layers // layout.pp, 1)
    found = []
    if layout.tp > 1:
        found.append(Collective("all_reduce", "tensor", layout.tp).add(hidden, 4 * layers * micro))
    if layout.pp > 1:
        # per micro-batch a stage receives its input and sends its output forward, and the
        # gradients back: the first and last stage one of each, a middle stage two
        hops = 1 if layout.pp == 2 else 2
        found.append(Collective("send", "pipe", 2).add(hidden, hops * micro))
        found.append(Collective("recv", "pipe", 2).add(hidden, hops * micro))
        # per step: the stages agree the batch is there (an int64 status), the last stage
        # broadcasts the fp32 loss (averaged over data-parallel replicas first)
        found.append(Collective("all_reduce", "pipe", layout.pp).add(8))
        found.append(Collective("broadcast", "pipe", layout.pp).add(4))
        if layout.dp > 1:
            found.append(Collective("all_reduce", "data", layout.dp).add(4))
    if layout.ep > 1 and spec.num_experts > 1:
        # dispatch and combine, forward and backward: every slot of every expert, each rank
        # sending each other rank its experts' share (with tensor parallelism each TP rank
        # sends its 1/tp of the slots)
        slots = expert_slots(spec, tokens) * spec.hidden_size * act_bytes // layout.tp
        moe_layers = max(spec.expert_layers // layout.pp, 1)
        found.append(Collective("all_to_all_single", "expert", layout.ep)
                     .add(slots, 4 * moe_layers * micro))
    if layout.sp > 1:
        found.append(Collective("all_to_all_single", "sequence", layout.sp)
                     .add(hidden // layout.tp, 8 * layers * micro))
    return found


def per_step(spec: ModelSpec, layout: Layout) -> List[Collective]:
    return data_parallel(spec, layout) + model_parallel(spec, layout)


def by_name(collectives: List[Collective]) -> Dict[str, int]:
    """``{collective name: bytes per step}``: what the comms logger's summary adds up to."""
    totals = defaultdict(int)
    for c in collectives:
        totals[c.name] += c.bytes
    return dict(totals)


def by_name_and_size(collectives: List[Collective]) -> Dict[str, Dict[int, int]]:
    """``{collective name: {message size: calls}}`` per step: the comms logger's summary
    shape (its call counts), for a check call by call rather than in total."""
    found = defaultdict(Counter)
    for c in collectives:
        found[c.name].update(c.sizes)
    return {name: dict(sizes) for name, sizes in found.items()}


def _spans_nodes(layout: Layout, cluster: Cluster, group: str) -> bool:
    """Rank order is tp fastest, then sp, dp, pp (Megatron's): a group crosses nodes when its
    members' span exceeds a node."""
    stride_size = {"tensor": (1, layout.tp), "sequence": (layout.tp, layout.sp),
                   "data": (layout.tp, layout.sp * layout.dp),
                   "expert": (layout.tp * layout.sp, layout.ep),
                   "expert_data": (layout.tp * layout.sp * layout.ep, layout.dp // layout.ep),
                   "pipe": (layout.tp * layout.sp * layout.dp, layout.pp)}[group]
    stride, size = stride_size
    return stride * size > cluster.gpus_per_node


def comm_seconds(c: Collective, layout: Layout, cluster: Cluster) -> float:
    inter = _spans_nodes(layout, cluster, c.group) and cluster.nodes > 1
    bandwidth = cluster.inter_bw if inter else cluster.intra_bw
    latency = cluster.inter_latency if inter else cluster.intra_latency
    steps = 2 * (c.group_size - 1) if c.name == "all_reduce" else max(c.group_size - 1, 1)
    return c.wire_bytes() / bandwidth + c.calls * steps * latency
