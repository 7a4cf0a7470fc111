"""The autotuning space seen through ``deepspeed.plan``: which experiments fit, which are worth
running.

The profiling run measures the model on the real hardware (parameters and their sizes, the
bytes autograd keeps for one sample, the forward FLOPs of one sample, the memory a rank has);
``deepspeed.plan`` turns that into a model description, and every experiment's config into a
layout. Two questions are then answered without launching anything:

- does it fit? The plan's per-rank peak (model states as ZeRO partitions them, activations,
  the engine's own buffers and the optimizer step's transients) within ``MEMORY_HEADROOM`` of
  the rank's memory. This is the autotuner's only memory model (always on when there is a
  profile).
- is it worth measuring? With ``autotuning.plan_pruning`` the plan's roofline step time ranks
  the experiments of the whole space; those predicted below ``plan_keep_ratio`` of the best
  predicted score are skipped (a micro-batch so small that per-step costs dominate, a stage
  whose communication cannot hide behind backward). The roofline knows FLOPs, links and memory
  bandwidth, not the framework's fixed costs per micro-batch (kernel launches, Python), which
  dominate small models; the profiling run times a few steps of its micro-batch, and what they
  took beyond the roofline becomes the plan's ``step_overhead_s`` (``calibrate``).

The profiled figures are one rank's own (a model-parallel rank holds its shard), so the plan
lays the model over the data-parallel ranks only.
"""
from dataclasses import replace
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from deepspeed.plan import (Cluster, Estimate, ModelSpec, cluster as plan_cluster, estimate,
                            from_measurements, layout_from_config)

MEMORY_HEADROOM = 0.9  # allocator fragmentation, the framework itself, what the plan misses


def spec_from_model_info(model_info: dict) -> ModelSpec:
    """The plan's model description from the profiling run's ``model_info.json`` (or the
    user's ``model_info``: a bare ``num_params`` plans model states only)."""
    return from_measurements(
        num_params=model_info.get("num_params") or 0,
        activation_bytes_per_sample=model_info.get("activation_mem_per_sample") or 0,
        flops_per_sample=model_info.get("fwd_flops_per_sample") or 0,
        param_numels=model_info.get("param_numels") or (),
        bytes_per_param=model_info.get("bytes_per_param") or 4,
        num_layers=model_info.get("num_layers") or 1,
        hidden_size=model_info.get("hidden_size") or 0, name="profiled model")


def this_cluster(memory_per_rank: int, dp_world: int, ranks_per_node: int,
                 accelerator: str) -> Cluster:
    """The hardware the experiments run on: this machine's figures on CPU, the H100 node
    preset's links and rates on an accelerator (only their ratios rank the experiments), with
    the measured memory per rank."""
    per_node = max(min(ranks_per_node, dp_world), 1)
    preset = "cpu-local" if accelerator == "cpu" else "dgx-h100"
    return plan_cluster(preset, nodes=max(dp_world // per_node, 1), gpus_per_node=per_node,
                        gpu_memory=int(memory_per_rank * MEMORY_HEADROOM))


class ExperimentPlanner:
    """``deepspeed.plan``'s estimate of each experiment config on ``dp_world`` ranks."""

    def __init__(self, model_info: dict, dp_world: int, ranks_per_node: int = 0,
                 accelerator: Optional[str] = None):
        if accelerator is None:
            from deepspeed.accelerator import get_accelerator

            accelerator = get_accelerator().device_name()
        self.spec = spec_from_model_info(model_info)
        self.dp_world = dp_world
        self.cluster = this_cluster(model_info["memory_per_rank"], dp_world,
                                    ranks_per_node or dp_world, accelerator)

    def calibrate(self, config: dict, latency_ms: float) -> float:
        """Set the cluster's fixed cost per micro-batch from one measured step of ``config``
        (the profiling run's): what the measured step took beyond the roofline's estimate.
        Returns it in seconds."""
        planned = estimate(self.spec, layout_from_config(config, world_size=self.dp_world),
                           replace(self.cluster, step_overhead_s=0.0))
        gas = planned.layout.grad_accum
        overhead = max(latency_ms / 1000.0 - planned.step_s, 0.0) / gas
        self.cluster = replace(self.cluster, step_overhead_s=overhead)
        return overhead

    def estimate(self, config: dict) -> Estimate:
        return estimate(self.spec, layout_from_config(config, world_size=self.dp_world),
                        self.cluster)

    def fits(self, config: dict) -> bool:
        return self.estimate(config).fits

    def score(self, config: dict, metric: str) -> Optional[float]:
        """The predicted metric as a score (higher is better), None when it does not fit:
        samples per second for throughput and FLOPS (the FLOPs per sample are fixed),
        steps per second for latency."""
        found = self.estimate(config)
        if not found.fits:
            return None
        if metric == "latency":
            return 1.0 / found.step_s if found.step_s > 0 else 0.0
        return found.samples_per_s


def planner_for(model_info: Optional[dict], dp_world: int,
                ranks_per_node: int = 0) -> Optional[ExperimentPlanner]:
    """A planner when the profile says how much memory a rank has, else None (no pruning)."""
    if not model_info or not model_info.get("memory_per_rank") or not model_info.get("num_params"):
        return None
    return ExperimentPlanner(model_info, dp_world, ranks_per_node)


def largest_fitting(fits: Callable[[int], bool], cap: int) -> int:
    """The largest ``m`` in ``[1, cap]`` with ``fits(m)`` (memory grows with ``m``), 0 if none."""
    if fits(cap):
        return cap
    low, high = 0, cap  # fits(low) (or low == 0), not fits(high)
    while high - low > 1:
        middle = (low + high) // 2
        if fits(middle):
            low = middle
        else:
            high = middle
    return low


def prune(points: Sequence, score: Callable[[object], Optional[float]],
          keep_ratio: float) -> Tuple[List, Dict[object, str]]:
    """(points worth running, in their order; {skipped point: why}). A point is skipped when
    its predicted score is None (does not fit) or below ``keep_ratio`` of the best predicted."""
    predicted = {point: score(point) for point in points}
    feasible = [value for value in predicted.values() if value is not None]
    best = max(feasible, default=None)
    kept, skipped = [], {}
    for point in points:
        value = predicted[point]
        if value is None:
            skipped[point] = "the plan's peak memory does not fit"
        elif value < keep_ratio * best:
            skipped[point] = f"the plan predicts {value / best:.0%} of the best"
        else:
            kept.append(point)
    return kept, skipped
