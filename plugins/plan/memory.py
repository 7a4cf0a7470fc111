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
    # whether the buffers are held while backward still keeps activations (False: the gradient
    # reduction runs once, after backward has freed them)
    buffers_during_backward: bool = True
    # a parameter's fresh gradient before autograd adds it to the one accumulated so far
    accumulation_transient: int = 0
    host_step_transient: int = 0  # the same on the host, for an offloaded optimizer

    @property
    def model_states(self) -> int:
        if self.estimator_model_states is not None:
            return self.estimator_model_states
        return self.params + self.grads + self.optimizer

    @property
    def backward_peak(self) -> int:
        buffers = sum(self.buffers.values())
        during = self.activations + self.accumulation_transient
        if self.buffers_during_backward:
            return self.model_states + during + buffers
        return self.model_states + max(during, buffers)

    @property
    def peak(self) -> int:
        """The larger of the backward peak and the step's."""
        return max(self.backward_peak, self._step_peak(self.step_transient))

    def _step_peak(self, transient):
        """The step's level: parameters, optimizer state, the step's own tensors and, where
        the step allocates none (no ZeRO), the whole gradients. ZeRO frees the whole
        gradients before its step (measured: bf16 and fp16 runs rest at their 16-bit weights
        and the fp32 partition, no 16-bit gradient), so the mixed-precision estimators'
        figure, which counts them, is the backward's, not the step's."""
        if transient == 0:
            return self.model_states
        return self.params + self.optimizer + transient

    @property
    def unified_peak(self) -> int:
        """The peak where the host and the accelerator are one memory (a CPU run, which is
        what this machine measures): the accelerator's backward peak on top of the host's
        resting share, or the step, with an offloaded optimizer's step on the host."""
        step = self._step_peak(self.step_transient + self.host_step_transient)
        return max(self.backward_peak, step) + self.host


def rank_params(spec: ModelSpec, layout: Layout) -> int:
    """Parameters one model-parallel shard holds before ZeRO: dense weights split over
    tensor and pipeline ranks, expert weights over expert ranks too."""
    dense = spec.total_params - spec.expert_params
    return dense // layout.model_parallel + spec.expert_params // (layout.model_parallel * layout.ep)


def shard_numels(spec: ModelSpec, layout: Layout):
    """This rank's share of each parameter before ZeRO (model parallelism splits each
    evenly; the planner does not know which tensor a scheme leaves whole). Expert
    parallelism keeps ``1/ep`` of the expert weights: with ``spec.expert_mask`` the first
    ``1/ep`` of the expert sizes (every expert of a layer has the same shapes; their order
    only matters to ZeRO's buckets, which keep experts apart anyway), without it the
    rank's total as one entry."""
    split = layout.model_parallel
    experts_split = layout.ep > 1 and spec.expert_params
    known = spec.param_numels and sum(spec.param_numels) == spec.total_params
    if not known or (experts_split and len(spec.expert_mask) != len(spec.param_numels)):
        return [rank_params(spec, layout)]
    numels = list(spec.param_numels)
    if split > 1:
        numels = [max(n // split, 1) for n in numels]
    if experts_split:
        dense, experts = split_experts(spec, numels)
        numels = dense + experts[:len(experts) // layout.ep]
    return numels


def split_experts(spec: ModelSpec, numels):
    """``(dense, expert)`` sizes out of ``numels`` (aligned with ``spec.param_numels``)."""
    mask = spec.expert_mask or (False,) * len(numels)
    return ([n for n, e in zip(numels, mask) if not e], [n for n, e in zip(numels, mask) if e])


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
    Saved tensors scale with the run's precision (the trace's dtype is the spec's).
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
    # traced in the model's dtype (a transformers config is traced in bf16), kept in the run's
    run_bytes = BYTES_PER_PARAM[layout.precision][0]
    return per_sample * layout.micro_batch * in_flight * run_bytes // spec.act_dtype_bytes


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


def accumulation_transient(spec: ModelSpec, layout: Layout) -> int:
    """A backward that accumulates into whole gradients (several micro-batches per step
    without ZeRO-2/3, which move each gradient out as it is produced) holds one parameter's
    fresh gradient beside its accumulated one until autograd adds them: the largest
    parameter's gradient at worst (measured on the two-stage pipeline, three micro-batches)."""
    if layout.grad_accum == 1 or layout.zero_stage >= 2:
        return 0
    largest = max(spec.param_numels, default=spec.largest_layer_params) // layout.tp
    return largest * BYTES_PER_PARAM[layout.precision][1]  # a pipeline splits no tensor


def reduces_after_backward(spec: ModelSpec, layout: Layout) -> bool:
    """Whether the gradient reduction runs once, after backward has freed the activations:
    stage 0's flat all-reduce at the accumulation boundary, and a ZeRO-1/2 reduce bucket that
    holds the whole model (measured: the peak of such runs is the model states and the
    reduction's buffer, with no activation on top). Smaller buckets reduce while backward
    runs, and ZeRO-3 gathers during it."""
    if layout.zero_stage == 0:
        return True
    return layout.zero_stage in (1, 2) and layout.reduce_bucket_size >= rank_params(spec, layout)


def step_transient(spec: ModelSpec, layout: Layout) -> int:
    """What an optimizer step allocates above the resting state (measured,
    ``docs/dev/benchmarks.md``). ZeRO-1/2, per element of the partition: the unscaled fp32
    gradient partition and the step's fp32 temporaries (4 + 4 bytes), the all-gather's copy
    of the updated piece in the weights' dtype, and with fp16 the overflow check's
    temporaries (4 more: fp32 runs step 12 bytes, bf16 10, fp16 14). ZeRO-3: one
    partition-sized fp32 tensor, and the refresh of the persistent parameters (one
    all-gather: its output and the send buffer with its staging copy, two whole copies of
    them)."""
    if layout.zero_stage == 0 or layout.zero_ranks == 1:
        return 0
    elements = -(-rank_params(spec, layout) // layout.zero_ranks)
    wb = BYTES_PER_PARAM[layout.precision][0]
    if layout.zero_stage in (1, 2):
        return elements * (4 + 4 + wb + (4 if layout.precision == "fp16" else 0))
    return elements * 4 + 2 * persistent_numel(spec, layout) * wb


def memory_per_rank(spec: ModelSpec, layout: Layout, cluster: Cluster) -> MemoryPlan:
    plan = model_states(spec, layout, cluster)
    plan.activations = activations(spec, layout)
    plan.buffers = engine_buffers(spec, layout)
    plan.buffers_during_backward = not reduces_after_backward(spec, layout)
    plan.accumulation_transient = accumulation_transient(spec, layout)
    transient = step_transient(spec, layout)
    if layout.offload_optimizer == "none":
        plan.step_transient = transient
    else:  # the step runs where the optimizer state is (measured: the same three partitions)
        plan.host_step_transient = transient
    return plan


def fits(plan: MemoryPlan, layout: Layout, cluster: Cluster) -> bool:
    """Whether the accelerator peak, the host share and the NVMe share fit this cluster."""
    ranks_per_node = min(cluster.gpus_per_node, layout.world_size)
    return (plan.peak <= cluster.gpu_memory
            and plan.host * ranks_per_node <= cluster.host_memory
            and plan.nvme * ranks_per_node <= max(cluster.nvme, 0))
