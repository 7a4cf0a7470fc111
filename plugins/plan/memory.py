"""Bytes one rank holds for a layout: model states, activations, the engine's buffers, the peak.

Model states follow the DeepSpeed memory-requirements arithmetic (bytes per parameter: 2 fp16/
bf16 weights, 2 gradients, 16 of fp32 master weights, gradients and Adam moments in mixed
precision; 4 + 4 + 8 in plain fp32) divided the way each ZeRO stage partitions them over the
data-parallel ranks. For mixed-precision ZeRO-2 and ZeRO-3 the accelerator and host totals
*are* the documented estimators' answers (``deepspeed.zero.estimate_zero*_model_states_mem_needs``
called with this rank's share of the model), so the two can never disagree.

Beyond model states the engine holds transient buffers that decide the peak on small models:
the flat all-reduce copy of every gradient at stage 0 (the core reduces in one flat buffer),
the flat send buffer of a ZeRO reduce bucket, the fp32 gradient partition. These were read off
measured runs of our engine (``docs/dev/benchmarks.md``); each is named in ``MemoryPlan``.
"""
from dataclasses import dataclass, field
from typing import Dict

from deepspeed.zero import (estimate_zero2_model_states_mem_needs,
                            estimate_zero3_model_states_mem_needs)

from deepspeed.plan.cluster import Cluster
from deepspeed.plan.layout import Layout
from deepspeed.plan.model_spec import ModelSpec

# bytes per parameter: (weight, gradient, optimizer state incl. fp32 masters)
BYTES_PER_PARAM = {"bf16": (2, 2, 16), "fp16": (2, 2, 16), "fp32": (4, 4, 8)}
# the estimators' factor for CPU-side figures (their default)
ESTIMATOR_BUFFER_FACTOR = 1.5


@dataclass
class MemoryPlan:
    """Per-rank bytes. ``device`` items live on the accelerator, ``host`` on the node's CPU
    memory (its share per rank) and ``nvme`` on disk. ``peak`` is the accelerator's."""
    params: int
    grads: int
    optimizer: int
    activations: int
    buffers: Dict[str, int] = field(default_factory=dict)
    host: int = 0
    nvme: int = 0
    estimator_model_states: int = None  # the documented estimator's figure, where it applies
    step_transient: int = 0  # what the optimizer step allocates above the resting state

    @property
    def model_states(self) -> int:
        if self.estimator_model_states is not None:
            return self.estimator_model_states
        return self.params + self.grads + self.optimizer

    @property
    def peak(self) -> int:
        """The larger of the backward peak (everything held at once) and the step's."""
        backward = self.model_states + self.activations + sum(self.buffers.values())
        whole_grads_kept = self.step_transient == 0
        step = self.model_states - (0 if whole_grads_kept else self.grads) + self.step_transient
        return max(backward, step)


def rank_params(spec: ModelSpec, layout: Layout) -> int:
    """Parameters one model-parallel shard holds before ZeRO: dense weights split over
    tensor and pipeline ranks, expert weights over expert ranks too."""
    dense = spec.total_params - spec.expert_params
    return dense // layout.model_parallel + spec.expert_params // (layout.model_parallel * layout.ep)


def shard_numels(spec: ModelSpec, layout: Layout):
    """This rank's share of each parameter before ZeRO (model parallelism splits each
    evenly; the planner does not know which tensor a scheme leaves whole)."""
    split = layout.model_parallel
    if spec.param_numels and sum(spec.param_numels) == spec.total_params:
        numels = ([max(n // split, 1) for n in spec.param_numels] if split > 1
                  else list(spec.param_numels))
    else:
        numels = [rank_params(spec, layout)]
    return numels


def persistent_numel(spec: ModelSpec, layout: Layout) -> int:
    """Elements of the parameters ZeRO-3 keeps whole on every rank (those smaller than
    ``stage3_param_persistence_threshold``); 0 when the parameter sizes are unknown."""
    if layout.zero_stage != 3 or not spec.param_numels:
        return 0
    return sum(n for n in shard_numels(spec, layout) if n < layout.param_persistence_threshold)


def _dp_nodes(layout: Layout, cluster: Cluster):
    """(data-parallel ranks per node, nodes) as the estimators count them: the ranks one
    model-parallel shard is replicated over, laid out densely on nodes."""
    per_node = max(cluster.gpus_per_node // layout.model_parallel, 1)
    per_node = min(per_node, layout.zero_ranks)
    return per_node, max(layout.zero_ranks // per_node, 1)


def model_states(spec: ModelSpec, layout: Layout, cluster: Cluster) -> MemoryPlan:
    """Parameters, gradients and optimizer state per rank, with what is offloaded.

    From stage 1 on the optimizer steps an fp32 partition of its own with its fp32 gradient
    partition (16 bytes per parameter over ``dp``, fp32 training included: the partition is a
    copy, not a view of the weights). Stage 2 keeps no whole gradients: each gradient goes
    into the reduce bucket as backward produces it (``grads`` is the largest gradient not yet
    placed; the bucket is an engine buffer). Stage 3 keeps its persistent parameters whole
    (measured: a model of only persistent parameters rests at its whole weights plus the
    optimizer's partition) and the others as shards.
    """
    count = rank_params(spec, layout)
    wb, gb, ob = BYTES_PER_PARAM[layout.precision]
    n = layout.zero_ranks
    stage = layout.zero_stage
    shard = -(-count // n)
    if stage < 3:
        params = count * wb
    else:
        persistent = persistent_numel(spec, layout)
        params = (persistent + -(-(count - persistent) // n)) * wb
    if stage < 2:
        grads = count * gb
    else:
        largest = max(spec.param_numels, default=spec.largest_layer_params)
        grads = min(largest, count) * gb
    optimizer = count * ob if stage == 0 else shard * 16
    plan = MemoryPlan(params=params, grads=grads, optimizer=optimizer, activations=0)
    if layout.offload_optimizer != "none":
        target = "host" if layout.offload_optimizer == "cpu" else "nvme"
        setattr(plan, target, getattr(plan, target) + optimizer)
        plan.optimizer = 0
    if layout.offload_param != "none":
        target = "host" if layout.offload_param == "cpu" else "nvme"
        setattr(plan, target, getattr(plan, target) + params)
        plan.params = 0
    if layout.precision != "fp32" and stage in (2, 3):
        per_node, nodes = _dp_nodes(layout, cluster)
        largest = min(spec.largest_layer_params, count)
        if stage == 2:
            cpu, gpu = estimate_zero2_model_states_mem_needs(
                count, per_node, nodes, cpu_offload=layout.offload_optimizer != "none",
                additional_buffer_factor=ESTIMATOR_BUFFER_FACTOR)
        else:
            cpu, gpu, _ = estimate_zero3_model_states_mem_needs(
                count, largest, per_node, nodes, cpu_offload=layout.offload_optimizer != "none",
                cpu_offload_params=layout.offload_param != "none", zero_init=True,
                additional_buffer_factor=ESTIMATOR_BUFFER_FACTOR)
        plan.estimator_model_states = gpu
        if layout.offload_optimizer == "cpu" or layout.offload_param == "cpu":
            plan.host = cpu  # the estimators' CPU figure is per process already
    return plan


def activations(spec: ModelSpec, layout: Layout) -> int:
    """Bytes kept for backward by the micro-batches in flight on one rank.

    Tensor and sequence parallelism split each layer's activations over their ranks (the
    Megatron split leaves the layer norms' inputs whole; the trace cannot tell them apart, so
    the whole figure is divided: slightly optimistic for ``tp > 1``). A pipeline stage holds
    ``1/pp`` of the layers but up to ``pp`` micro-batches at once (1F1B's warm-up). With
    activation checkpointing a layer keeps only its input, plus one layer recomputed whole.
    """
    split = layout.tp * layout.sp
    per_sample = spec.activation_bytes // split
    if layout.activation_checkpointing:
        layers = max(spec.num_layers // layout.pp, 1)
        per_sample = (spec.layer_input_bytes // layout.sp) * layers \
            + spec.layer_activation_bytes // split
    else:
        per_sample = per_sample // layout.pp
    in_flight = min(layout.pp, layout.grad_accum) if layout.pp > 1 else 1
    return per_sample * layout.micro_batch * in_flight


def engine_buffers(spec: ModelSpec, layout: Layout) -> Dict[str, int]:
    """The engine's own transient buffers at the backward peak (see the module docstring):
    stage 0's flat all-reduce copy of every gradient, a ZeRO reduce bucket's flat send
    buffer and receive piece, stage 3's prefetched parameters."""
    if layout.zero_ranks == 1:
        return {}
    count = rank_params(spec, layout)
    wb, gb, _ = BYTES_PER_PARAM[layout.precision]
    if layout.zero_stage == 0:
        return {"flat all-reduce": count * gb}
    buffers = {"reduce bucket": min(layout.reduce_bucket_size, count) * gb}
    if layout.zero_stage in (1, 2) and layout.grad_accum > 1:
        # a bucket's reduced piece lands in a fresh buffer when its gradient partition already
        # holds something: every reduction after the first of an accumulation
        bucket = min(layout.reduce_bucket_size, count)
        buffers["receive piece"] = -(-bucket // layout.zero_ranks) * gb
    if layout.zero_stage == 3:  # persistent parameters are never gathered
        gathered = count - persistent_numel(spec, layout)
        if gathered:
            buffers["prefetch"] = min(layout.prefetch_bucket_size, gathered) * wb
    return buffers


def step_transient(spec: ModelSpec, layout: Layout) -> int:
    """What an optimizer step allocates above the resting state (measured,
    ``docs/dev/benchmarks.md``). ZeRO-1/2: the unscaled gradient partition, the step's
    temporaries and the all-gather's copy of the updated piece (three partition-sized fp32
    tensors). ZeRO-3: one partition-sized fp32 tensor, and the refresh of the persistent
    parameters (one all-gather: its output and the send buffer with its staging copy, two
    whole copies of them)."""
    if layout.zero_stage == 0 or layout.zero_ranks == 1 or layout.offload_optimizer != "none":
        return 0
    partition = -(-rank_params(spec, layout) // layout.zero_ranks) * 4
    if layout.zero_stage in (1, 2):
        return 3 * partition
    wb = BYTES_PER_PARAM[layout.precision][0]
    return partition + 2 * persistent_numel(spec, layout) * wb


def memory_per_rank(spec: ModelSpec, layout: Layout, cluster: Cluster) -> MemoryPlan:
    plan = model_states(spec, layout, cluster)
    plan.activations = activations(spec, layout)
    plan.buffers = engine_buffers(spec, layout)
    plan.step_transient = step_transient(spec, layout)
    return plan


def fits(plan: MemoryPlan, layout: Layout, cluster: Cluster) -> bool:
    """Whether the accelerator peak, the host share and the NVMe share fit this cluster."""
    ranks_per_node = min(cluster.gpus_per_node, layout.world_size)
    return (plan.peak <= cluster.gpu_memory
            and plan.host * ranks_per_node <= cluster.host_memory
            and plan.nvme * ranks_per_node <= max(cluster.nvme, 0))
