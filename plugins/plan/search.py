"""Estimate one layout, enumerate the feasible ones for a global batch, rank them.

Step time is a roofline: the rank's share of the training FLOPs (forward x3, x4 with
activation checkpointing's recompute) at the cluster's sustained rate, plus the pipeline
bubble, plus the communication the step cannot hide, plus the optimizer step. Data-parallel
reduction overlaps backward (``overlap_comm``), so only the part longer than backward counts;
tensor, sequence and expert collectives sit on the critical path; offloaded optimizer steps add
the host-link transfer. The optimizer step is bound by memory bandwidth, not FLOPs: it reads and
writes the optimizer state, reads the gradient and rewrites the weights of this rank's
partition once per step (ZeRO 1-3 divide it by ``dp``; an offloaded step runs at the host's
bandwidth), which is what makes fewer, larger micro-batches cheaper per sample. A cluster's
``step_overhead_s`` (measured, not a preset's) adds the framework's fixed cost per micro-batch.
Ranking is by tokens per second among layouts whose peak fits.
"""
import functools
import itertools
from dataclasses import dataclass
from typing import Iterable, List, Optional, Sequence

from deepspeed.plan.cluster import Cluster
from deepspeed.plan.comms import Collective, comm_seconds, data_parallel, model_parallel
from deepspeed.plan.layout import Layout
from deepspeed.plan.memory import BYTES_PER_PARAM, MemoryPlan, fits, memory_per_rank, rank_params
from deepspeed.plan.model_spec import ModelSpec

PCIE_BW = 25e9  # bytes/s host <-> accelerator for offloaded optimizer traffic


@dataclass
class Estimate:
    layout: Layout
    memory: MemoryPlan
    collectives: List[Collective]
    compute_s: float
    comm_s: float
    step_s: float
    fits: bool
    update_s: float = 0.0  # the optimizer step (part of step_s)
    seq_len: int = 0

    @property
    def tokens_per_s(self) -> float:
        return 0.0 if self.step_s <= 0 else self.layout.global_batch * self.seq_len / self.step_s

    @property
    def samples_per_s(self) -> float:
        return 0.0 if self.step_s <= 0 else self.layout.global_batch / self.step_s


# what data_parallel() reads of a layout (grad_accum only at stage 3): layouts differing in
# anything else share one computation
_DP_FIELDS = ("dp", "tp", "pp", "sp", "zero_stage", "precision", "reduce_bucket_size",
              "allgather_bucket_size", "param_persistence_threshold")


@functools.lru_cache(maxsize=4096)
def _dp_collectives(spec, key, grad_accum):
    return data_parallel(spec, Layout(**dict(key), grad_accum=grad_accum))


def update_seconds(spec: ModelSpec, layout: Layout, cluster: Cluster) -> float:
    """The optimizer step at memory bandwidth: every optimizer-state byte read and written,
    the gradient read, the weight read and written, for this rank's partition."""
    wb, gb, ob = BYTES_PER_PARAM[layout.precision]
    count = rank_params(spec, layout)
    if layout.zero_stage >= 1:
        count = -(-count // layout.zero_ranks)
    moved = count * (2 * ob + gb + 2 * wb)
    if layout.offload_optimizer != "none":
        ranks = min(cluster.gpus_per_node, layout.world_size)
        return moved / (cluster.host_memory_bw / ranks)
    return moved / cluster.memory_bw


def estimate(spec: ModelSpec, layout: Layout, cluster: Cluster) -> Estimate:
    memory = memory_per_rank(spec, layout, cluster)
    dp_key = tuple((k, getattr(layout, k)) for k in _DP_FIELDS)
    dp_comm = _dp_collectives(spec, dp_key, layout.grad_accum if layout.zero_stage == 3 else 1)
    mp_comm = model_parallel(spec, layout)
    recompute = 4 if layout.activation_checkpointing else 3
    flops = spec.flops_per_sample * recompute * layout.micro_batch * layout.grad_accum \
        / (layout.tp * layout.pp * layout.sp)
    compute = flops / (cluster.peak_flops * cluster.mfu)
    bubble = compute * (layout.pp - 1) / layout.grad_accum
    backward = compute * 2 / 3
    dp_time = sum(comm_seconds(c, layout, cluster) for c in dp_comm)
    exposed_dp = dp_time if layout.zero_stage == 3 else max(dp_time - backward, 0.0)
    mp_time = sum(comm_seconds(c, layout, cluster) for c in mp_comm)
    offload = 0.0
    if layout.offload_optimizer != "none":
        shard = rank_params(spec, layout) / layout.zero_ranks
        offload = shard * 4 * 2 / PCIE_BW  # fp32 gradients out, updated weights back
        if layout.offload_optimizer == "nvme":
            offload += memory.nvme * 2 / (cluster.nvme_bw / cluster.gpus_per_node)
    comm = exposed_dp + mp_time + offload
    update = update_seconds(spec, layout, cluster)
    return Estimate(layout=layout, memory=memory, collectives=dp_comm + mp_comm, compute_s=compute,
                    comm_s=comm,
                    step_s=(compute + bubble + comm + update
                            + cluster.step_overhead_s * layout.grad_accum),
                    fits=fits(memory, layout, cluster), seq_len=spec.seq_len, update_s=update)


def _powers_of_two(limit: int) -> List[int]:
    return [2**i for i in range(limit.bit_length()) if 2**i <= limit]


def layouts(spec: ModelSpec, cluster: Cluster, global_batch: int, precision: str = "bf16",
            stages: Sequence[int] = (0, 1, 2, 3), offloads: Sequence[str] = ("none", "cpu"),
            max_tp: Optional[int] = None, max_pp: int = 16, max_sp: int = 8,
            activation_checkpointing: Sequence[bool] = (False, True)) -> Iterable[Layout]:
    """Every layout of the whole cluster that divides the model and the batch evenly: tp
    within a node and dividing the heads, pp dividing the layers, sp dividing the heads, ep
    dividing the experts and dp, micro-batch times accumulation times dp the global batch."""
    world = cluster.world_size
    heads = spec.num_heads or 1
    for tp in _powers_of_two(min(max_tp or cluster.gpus_per_node, cluster.gpus_per_node)):
        if heads % tp:
            continue
        for pp in _powers_of_two(min(max_pp, spec.num_layers)):
            if spec.num_layers % pp:
                continue
            for sp in _powers_of_two(max_sp):
                if heads % (tp * sp) or world % (tp * pp * sp):
                    continue
                dp = world // (tp * pp * sp)
                if global_batch % dp:
                    continue
                per_rank = global_batch // dp
                for ep in _powers_of_two(min(spec.num_experts, dp)):
                    if spec.num_experts % ep or dp % ep:
                        continue
                    for stage, offload, mb, ac in itertools.product(
                            stages, offloads, _powers_of_two(per_rank), activation_checkpointing):
                        if per_rank % mb or (pp > 1 and stage > 1) or (offload != "none" and stage == 0) \
                                or (dp * sp == 1 and stage > 0 and offload == "none"):
                            continue  # unsupported, or (one rank per weight) the same as stage 0
                        param_offloads = ("none", "cpu") if stage == 3 and offload == "cpu" else ("none",)
                        for offload_param in param_offloads:
                            yield Layout(dp=dp, tp=tp, pp=pp, sp=sp, ep=ep, zero_stage=stage,
                                         offload_optimizer=offload, offload_param=offload_param,
                                         micro_batch=mb, grad_accum=per_rank // mb,
                                         activation_checkpointing=ac, precision=precision)


def search(spec: ModelSpec, cluster: Cluster, global_batch: int, top: int = 10,
           **space) -> List[Estimate]:
    """The ``top`` fitting layouts by estimated tokens per second (ties: less memory)."""
    found = [e for e in (estimate(spec, layout, cluster)
                         for layout in layouts(spec, cluster, global_batch, **space)) if e.fits]
    found.sort(key=lambda e: (-e.tokens_per_s, e.memory.peak))
    return found[:top]
