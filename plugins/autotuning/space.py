"""The tuning space: what the user's config leaves open, and which points memory rules out.

A value the user wrote is fixed; ``"auto"`` (or no value) is tuned over the default space; a list
is tuned over exactly that list. ZeRO stage and micro-batch size per GPU are always tuning
dimensions; with ``fast: false`` the stage's ZeRO knobs are too. Memory pruning asks
``deepspeed.plan`` (through ``planning.ExperimentPlanner``, fed by the profiling run) whether
each experiment's per-rank peak fits: model states as the stage partitions them, the
activations of the micro-batch, the engine's buffers.
"""
import copy
import itertools
import math
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

from deepspeed.autotuning.planning import largest_fitting

AUTO = "auto"
STAGES = (0, 1, 2, 3)

# the ZeRO knobs tuned with ``fast: false``, per stage: config key -> values tried
_BUCKETS = [50_000_000, 500_000_000, 1_000_000_000]
KNOB_SPACES = {
    0: {},
    1: {"reduce_bucket_size": _BUCKETS, "allgather_bucket_size": _BUCKETS},
    2: {"overlap_comm": [True, False], "reduce_scatter": [True, False],
        "reduce_bucket_size": _BUCKETS, "allgather_bucket_size": _BUCKETS},
    3: {"overlap_comm": [True, False], "reduce_bucket_size": _BUCKETS,
        "stage3_prefetch_bucket_size": _BUCKETS,
        "stage3_param_persistence_threshold": [10_000, 100_000, 1_000_000]},
}
KNOB_SHORT = {"reduce_bucket_size": "rbs", "allgather_bucket_size": "abs", "overlap_comm": "oc",
              "reduce_scatter": "rs", "stage3_prefetch_bucket_size": "pbs",
              "stage3_param_persistence_threshold": "ppt"}


class NothingToTuneError(ValueError):
    """Every tuning dimension is fixed by the user's config."""


@dataclass(frozen=True)
class Point:
    """One experiment: a ZeRO stage, a micro-batch size, accumulation steps, ZeRO knobs."""

    stage: int
    micro_batch: int
    gas: int
    knobs: Tuple[Tuple[str, Any], ...] = ()

    @property
    def name(self):
        text = f"z{self.stage}_gas{self.gas}_tmbspg{self.micro_batch}"
        for key, value in self.knobs:
            short = KNOB_SHORT.get(key, key)
            text += f"_{short}{_short_value(value)}"
        return text


def _short_value(value):
    if isinstance(value, bool):
        return "T" if value else "F"
    if isinstance(value, (int, float)) and value >= 1e6 and float(value).is_integer():
        return f"{value / 1e6:g}M"
    return f"{value}"


def _axis(value, default, key):
    """(values to try, fixed?) of one config value: auto/absent -> default, list -> itself."""
    if value is None or value == AUTO:
        return list(default), False
    if isinstance(value, list):
        if not value:
            raise ValueError(f"{key}: an empty list leaves nothing to try")
        return list(value), len(value) == 1
    return [value], True


@dataclass
class Space:
    """The dimensions left open by a config, for ``dp_world`` data-parallel ranks."""

    stages: List[int]
    stage_fixed: bool
    micro_batches: Optional[List[int]]  # None: chosen per stage from the memory estimate
    micro_fixed: bool
    gas: Optional[int]  # None: derived from a fixed train_batch_size
    train_batch_size: Optional[int]
    knob_spaces: Dict[int, Dict[str, list]] = field(default_factory=dict)
    fixed_knobs: Dict[str, Any] = field(default_factory=dict)


def _positive_int(value, key):
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{key}: {value!r} is not a positive integer, \"auto\" or a list of them")
    return value


def build_space(user_config: dict, section, source="the DeepSpeed config") -> Space:
    """Read what the user fixed; raise ``NothingToTuneError`` when nothing is left open."""
    zero = user_config.get("zero_optimization") or {}
    if not isinstance(zero, dict):
        raise ValueError(f"zero_optimization must be a dict, got {zero!r}")
    stages, stage_fixed = _axis(zero.get("stage"), STAGES, "zero_optimization.stage")
    for stage in stages:
        if stage not in STAGES:
            raise ValueError(f"zero_optimization.stage: {stage!r} is not a ZeRO stage; allowed: "
                             f"0, 1, 2, 3, \"auto\" or a list of them")
    mbs_value = user_config.get("train_micro_batch_size_per_gpu")
    micro, micro_fixed = (None, False) if mbs_value in (None, AUTO) else \
        _axis(mbs_value, (), "train_micro_batch_size_per_gpu")
    for value in micro or []:
        _positive_int(value, "train_micro_batch_size_per_gpu")
    gas_value = user_config.get("gradient_accumulation_steps")
    tbs_value = user_config.get("train_batch_size")
    tbs = None if tbs_value in (None, AUTO) else _positive_int(tbs_value, "train_batch_size")
    if gas_value in (None, AUTO):
        gas = None if tbs is not None else 1
    else:
        gas = _positive_int(gas_value, "gradient_accumulation_steps")
        if tbs is not None:
            micro_fixed, micro = True, None  # all three follow from tbs and gas
    knob_spaces, fixed_knobs = {}, {}
    if not section.fast:
        for stage in stages:
            space = {}
            for key, default in KNOB_SPACES[stage].items():
                values, fixed = _axis(zero.get(key), default, f"zero_optimization.{key}")
                if fixed:
                    fixed_knobs[key] = values[0]
                else:
                    space[key] = values
            knob_spaces[stage] = space
    space = Space(stages, stage_fixed, micro, micro_fixed, gas, tbs, knob_spaces, fixed_knobs)
    open_knobs = any(len(v) > 1 for s in knob_spaces.values() for v in s.values())
    if len(stages) == 1 and (micro_fixed or (micro is not None and len(micro) == 1)) \
            and not open_knobs:
        fixed = [f"zero_optimization.stage is {stages[0]}"]
        if micro is not None:
            fixed.append(f"train_micro_batch_size_per_gpu is {micro[0]}")
        else:
            fixed.append(f"train_batch_size ({tbs}) and gradient_accumulation_steps ({gas}) fix "
                         f"the micro-batch size")
        knobs = "" if not section.fast else " (and autotuning.fast is true, so no ZeRO knob " \
                                            "is tuned)"
        raise NothingToTuneError(
            f"autotuning has nothing to tune in {source}: {' and '.join(fixed)}{knobs}. Set one "
            f"of them to \"auto\" or to a list of values to try, or remove it")
    return space


# -- memory --------------------------------------------------------------------------------------
def max_micro_batch_for_memory(space: "Space", stage: int, planner, dp_world: int,
                               user_config: dict, cap: int) -> int:
    """The largest micro-batch (up to ``cap``) whose experiment the plan says fits a rank's
    memory (``deepspeed.autotuning.planning``); ``cap`` without a planner (nothing measured);
    0 when not even the model states fit."""
    if planner is None:
        return cap
    gas = space.gas or 1

    def fits(micro):
        config = experiment_config(user_config, Point(stage, micro, gas), dp_world, space, {})
        return planner.fits(config)

    return largest_fitting(fits, cap)


def spread(low: int, high: int, count: int) -> List[int]:
    """``count`` integers from ``low`` to ``high`` evenly spaced on a log scale (both ends kept)."""
    if high <= low or count <= 1:
        return [high]
    ratio = math.log(high / low) / (count - 1)
    values = sorted({int(round(low * math.exp(ratio * i))) for i in range(count)})
    return [v for v in values if low <= v <= high]


def micro_batches_for_stage(space: Space, stage: int, section, planner, dp_world: int,
                            user_config: dict) -> Tuple[List[int], str]:
    """(micro-batch sizes to try at ``stage``, why some were pruned or '' ). ``planner``: an
    ``ExperimentPlanner`` over the profiled model (None: no memory pruning)."""
    low = section.min_train_micro_batch_size_per_gpu
    cap = section.max_train_micro_batch_size_per_gpu
    gas = space.gas or 1
    if section.max_train_batch_size:
        cap = min(cap, section.max_train_batch_size // (gas * dp_world))
    low = max(low, math.ceil(section.min_train_batch_size / (gas * dp_world)))
    reason = ""
    if planner is not None:
        fits = max_micro_batch_for_memory(space, stage, planner, dp_world, user_config, cap)
        if fits < cap:
            reason = f"memory estimate allows micro-batch <= {fits} at stage {stage}"
        cap = min(cap, fits)
    if space.train_batch_size is not None and space.gas is None:
        share = space.train_batch_size // dp_world
        candidates = [m for m in (space.micro_batches or range(1, share + 1))
                      if share % m == 0 and space.train_batch_size % dp_world == 0]
        candidates = [m for m in candidates if low <= m <= cap]
        if space.micro_batches is None and candidates:
            picks = spread(candidates[0], candidates[-1], section.num_tuning_micro_batch_sizes)
            candidates = sorted({min(candidates, key=lambda c: abs(c - p)) for p in picks})
        return candidates, reason
    if space.micro_batches is not None:
        kept = [m for m in space.micro_batches if m <= cap]
        if len(kept) < len(space.micro_batches) and not reason:
            reason = f"micro-batch bounded by {cap} at stage {stage}"
        return kept, reason
    if cap < low:
        return [], reason or f"no micro-batch in [{low}, {cap}]"
    return spread(low, cap, section.num_tuning_micro_batch_sizes), reason


def points_for_stage(space: Space, stage: int, micro_batches: List[int], dp_world: int):
    points = []
    for micro in micro_batches:
        gas = space.gas if space.gas is not None else \
            space.train_batch_size // (micro * dp_world)
        points.append(Point(stage, micro, gas))
    return points


def knob_points(space: Space, base: Point) -> List[Point]:
    """Every combination of the stage's open ZeRO knobs at ``base``'s stage and micro-batch."""
    knobs = space.knob_spaces.get(base.stage) or {}
    if not knobs:
        return []
    keys = sorted(knobs)
    return [Point(base.stage, base.micro_batch, base.gas, tuple(zip(keys, values)))
            for values in itertools.product(*(knobs[k] for k in keys))]


def experiment_config(user_config: dict, point: Point, dp_world: int, space: Space,
                      autotuning: dict) -> dict:
    """The user's config with the point's values filled in (every batch "auto" resolved) and the
    experiment's ``autotuning`` section."""
    config = copy.deepcopy(user_config)
    zero = dict(config.get("zero_optimization") or {})
    zero["stage"] = point.stage
    for key, value in list(zero.items()):
        if isinstance(value, list):  # a tuning list the point did not pin: take the first
            zero[key] = value[0]
    zero.update(space.fixed_knobs)
    zero.update(dict(point.knobs))
    config["zero_optimization"] = zero
    config["train_micro_batch_size_per_gpu"] = point.micro_batch
    config["gradient_accumulation_steps"] = point.gas
    config["train_batch_size"] = point.micro_batch * point.gas * dp_world
    config["autotuning"] = autotuning
    return config
