"""``compute_elastic_config``: one global batch size that trains on many GPU counts.

Version 0.1 picks, among a few candidate batch sizes no larger than ``max_train_batch_size``, the
one that the most GPU counts in ``[min_gpus, max_gpus]`` can split into whole micro-batches of an
acceptable size. Candidates are ``base * h`` for each base (each micro-batch size and their least
common multiple) with ``h`` the largest highly composite number that keeps the product within
the maximum: highly composite numbers have more divisors than any smaller number, so they admit
the most GPU counts. Ties go to the larger batch (or the smaller with ``prefer_larger_batch:
false``).

Version 0.2 schedules whole nodes (``num_gpus_per_node``, with ``model_parallel_size`` GPUs per
model replica): it runs the 0.1 search over node counts, and when the current world is not one of
the valid sizes it still trains, with the largest batch under the maximum that the current
data-parallel size divides.
"""
import math
import os
from functools import reduce
from typing import List, Optional, Sequence, Tuple

from packaging.version import InvalidVersion, Version
from pydantic import ValidationError

from deepspeed.elasticity.config import (FORMAT, MINIMUM_DEEPSPEED_VERSION, ElasticityConfig,
                                         ElasticityConfigError, ElasticityError,
                                         ElasticityIncompatibleWorldSize)

ELASTICITY = "elasticity"
# set by a scheduler to the elasticity section it planned with; the job must not change it
DEEPSPEED_ELASTICITY_CONFIG = "DEEPSPEED_ELASTICITY_CONFIG"

# OEIS A002182 up to 720720: n with more divisors than every smaller number
HIGHLY_COMPOSITE_NUMBERS = (
    1, 2, 4, 6, 12, 24, 36, 48, 60, 120, 180, 240, 360, 720, 840, 1260, 1680, 2520, 5040, 7560,
    10080, 15120, 20160, 25200, 27720, 45360, 50400, 55440, 83160, 110880, 166320, 221760,
    277200, 332640, 498960, 554400, 665280, 720720)


def largest_highly_composite_at_most(value: int) -> int:
    """The largest listed highly composite number <= ``value`` (the last one above the list)."""
    best = HIGHLY_COMPOSITE_NUMBERS[0]
    for number in HIGHLY_COMPOSITE_NUMBERS:
        if number > value:
            break
        best = number
    return best


def candidate_batch_sizes(bases: Sequence[int], max_batch: int) -> List[int]:
    """Batch sizes worth considering: each base scaled by the largest highly composite factor
    that stays within ``max_batch`` (a base at or above it is kept as is)."""
    found = set()
    for base in bases:
        if base >= max_batch:
            found.add(base)
        else:
            found.add(base * largest_highly_composite_at_most(max_batch // base))
    return sorted(found)


def valid_gpu_counts(batch_size: int, micro_batches: Sequence[int], min_gpus: int,
                     max_gpus: int) -> List[int]:
    """GPU counts in ``[min_gpus, max_gpus]`` that split ``batch_size`` into whole micro-batches of
    one acceptable size (any number of accumulation steps)."""
    return [g for g in range(min_gpus, max_gpus + 1)
            if any(batch_size % (mb * g) == 0 for mb in micro_batches)]


def best_batch_size(candidates: Sequence[int], micro_batches: Sequence[int], min_gpus: int,
                    max_gpus: int, prefer_larger: bool) -> Tuple[int, List[int]]:
    best, best_gpus = None, []
    for batch in candidates:
        gpus = valid_gpu_counts(batch, micro_batches, min_gpus, max_gpus)
        if not gpus:
            continue
        better = (best is None or len(gpus) > len(best_gpus)
                  or (len(gpus) == len(best_gpus)
                      and (batch > best if prefer_larger else batch < best)))
        if better:
            best, best_gpus = batch, gpus
    if best is None:
        raise ElasticityError(
            f"no valid batch size: none of the candidate batch sizes {list(candidates)} "
            f"(<= max_train_batch_size, built from micro_batch_sizes {list(micro_batches)}) can "
            f"be split over any GPU count in [min_gpus={min_gpus}, max_gpus={max_gpus}]; raise "
            f"max_train_batch_size or max_gpus, or lower min_gpus")
    return best, best_gpus


def compatible_gpus_v01(micro_batches: Sequence[int], max_batch: int, min_gpus: int = 1,
                        max_gpus: Optional[int] = None,
                        prefer_larger: bool = True) -> Tuple[int, List[int]]:
    """Version 0.1: (final batch size, valid GPU counts)."""
    min_gpus = max(1, min_gpus or 1)
    max_gpus = max_gpus or max_batch // min(micro_batches)
    too_big = [mb for mb in micro_batches if mb > max_batch]
    if too_big:
        raise ElasticityConfigError(f"micro_batch_sizes {too_big} exceed max_train_batch_size "
                                    f"({max_batch})")
    lcm = reduce(lambda a, b: a * b // math.gcd(a, b), micro_batches)
    bases = sorted(set(micro_batches) | {lcm})
    return best_batch_size(candidate_batch_sizes(bases, max_batch), micro_batches, min_gpus,
                           max_gpus, prefer_larger)


def pick_micro_batch(batch_size: int, dp_world: int, micro_batches: Sequence[int],
                     prefer_larger: bool) -> Optional[int]:
    """The acceptable micro-batch size that divides each rank's share of ``batch_size``."""
    if batch_size % dp_world:
        return None
    fitting = [mb for mb in micro_batches if (batch_size // dp_world) % mb == 0]
    if not fitting:
        return None
    return max(fitting) if prefer_larger else min(fitting)


def compatible_gpus_v02(micro_batches: Sequence[int], max_batch: int, world_size: int,
                        min_gpus: int, max_gpus: int, prefer_larger: bool,
                        num_gpus_per_node: int, model_parallel_size: int):
    """Version 0.2: (final batch size, valid data-parallel sizes, micro-batch size) for a world
    of ``world_size`` GPUs, searching over whole nodes."""
    if num_gpus_per_node % model_parallel_size:
        raise ElasticityConfigError(f"num_gpus_per_node ({num_gpus_per_node}) is not divisible "
                                    f"by model_parallel_size ({model_parallel_size})")
    dp_per_node = num_gpus_per_node // model_parallel_size
    node_batch, node_counts = compatible_gpus_v01(
        micro_batches, max_batch // dp_per_node, max(1, min_gpus // num_gpus_per_node),
        max(1, max_gpus // num_gpus_per_node), prefer_larger)
    final_batch = node_batch * dp_per_node
    valid_dp = [n * dp_per_node for n in node_counts]
    dp_world = world_size // model_parallel_size
    if dp_world in valid_dp:
        return final_batch, valid_dp, pick_micro_batch(final_batch, dp_world, micro_batches,
                                                       prefer_larger)
    # this world is not one the search planned for: still train, with the largest (or smallest)
    # batch under the maximum that this data-parallel size splits evenly
    options = [(max_batch // (mb * dp_world)) * mb * dp_world for mb in micro_batches]
    options = [b for b in options if b > 0]
    if not options:
        raise ElasticityIncompatibleWorldSize(
            f"world size {world_size} ({dp_world} data-parallel ranks) cannot hold even one "
            f"micro-batch of {min(micro_batches)} per rank within max_train_batch_size "
            f"{max_batch}")
    batch = max(options) if prefer_larger else min(options)
    return batch, [dp_world], pick_micro_batch(batch, dp_world, micro_batches, prefer_larger)


def elasticity_enabled(ds_config: dict) -> bool:
    section = ds_config.get(ELASTICITY) if isinstance(ds_config, dict) else None
    return bool(isinstance(section, dict) and section.get("enabled", False))


def parse_elastic_config(section) -> ElasticityConfig:
    """Validate an ``elasticity`` dict, raising ``ElasticityConfigError`` naming the keys."""
    if not isinstance(section, dict):
        raise ElasticityConfigError(f"'elasticity' must be a dict, got {type(section).__name__}."
                                    f"\n{FORMAT}")
    try:
        return ElasticityConfig(**section)
    except ValidationError as exc:
        problems = "; ".join(f"elasticity.{'.'.join(str(p) for p in err['loc'])}: {err['msg']}"
                             if err["loc"] else f"elasticity: {err['msg']}"
                             for err in exc.errors())
        raise ElasticityConfigError(problems) from None


def ensure_immutable_elastic_config(runtime_elastic_config_dict: dict) -> None:
    """Fail when the scheduler planned with another elastic config than the job runs with (the
    scheduler's copy is in ``$DEEPSPEED_ELASTICITY_CONFIG``)."""
    import json

    planned_text = os.environ.get(DEEPSPEED_ELASTICITY_CONFIG)
    if not planned_text:
        return
    planned = parse_elastic_config(json.loads(planned_text))
    runtime = parse_elastic_config(runtime_elastic_config_dict)
    for key in ("max_train_batch_size", "micro_batch_sizes", "version"):
        if getattr(planned, key) != getattr(runtime, key):
            raise ElasticityConfigError(
                f"elasticity.{key} is {getattr(runtime, key)} in the job's config but the "
                f"scheduler planned with {getattr(planned, key)} "
                f"(${DEEPSPEED_ELASTICITY_CONFIG}); an elastic config must not change")


def _check_target_version(target_deepspeed_version) -> None:
    try:
        target = Version(str(target_deepspeed_version))
    except InvalidVersion:
        raise ElasticityConfigError(f"target_deepspeed_version {target_deepspeed_version!r} is "
                                    f"not a version number") from None
    if target < Version(MINIMUM_DEEPSPEED_VERSION):
        raise ElasticityConfigError(f"target_deepspeed_version {target} is older than "
                                    f"{MINIMUM_DEEPSPEED_VERSION}, the first with elasticity")


def compute_elastic_config(ds_config: dict, target_deepspeed_version: str, world_size: int = 0,
                           return_microbatch: bool = False):
    """The elastic batch plan of ``ds_config``.

    Returns ``(final_batch_size, valid_gpus)``; with ``world_size > 0`` or ``return_microbatch``
    also the micro-batch size per GPU for that world (version 0.2 reads ``$WORLD_SIZE`` when
    ``world_size`` is 0). Raises ``ElasticityConfigError`` for a missing/disabled/invalid
    section, ``ElasticityIncompatibleWorldSize`` when ``world_size`` is not valid (0.1), and
    ``ElasticityError`` when no batch size works at all.
    """
    if not isinstance(ds_config, dict):
        raise ElasticityConfigError(f"ds_config must be a dict, got {type(ds_config).__name__}")
    if ELASTICITY not in ds_config:
        raise ElasticityConfigError(f"'elasticity' is missing from the config.\n{FORMAT}")
    config = parse_elastic_config(ds_config[ELASTICITY])
    if not config.enabled:
        raise ElasticityConfigError("elasticity is disabled; set 'elasticity.enabled': true to "
                                    "compute an elastic batch size")
    _check_target_version(target_deepspeed_version)
    if config.version == 0.1:
        final_batch, valid = compatible_gpus_v01(config.micro_batch_sizes,
                                                 config.max_train_batch_size, config.min_gpus,
                                                 config.max_gpus, config.prefer_larger_batch)
        micro = None
        if world_size > 0:
            if world_size not in valid:
                raise ElasticityIncompatibleWorldSize(
                    f"world size {world_size} is not valid for the elastic batch size "
                    f"{final_batch}; valid GPU counts: {valid}")
            micro = pick_micro_batch(final_batch, world_size, config.micro_batch_sizes,
                                     config.prefer_larger_batch)
    else:
        if world_size <= 0:
            world_size = int(os.environ.get("WORLD_SIZE", "0") or 0)
        if world_size <= 0:
            raise ElasticityConfigError("elasticity version 0.2 needs the world size: pass "
                                        "world_size or set $WORLD_SIZE")
        final_batch, valid, micro = compatible_gpus_v02(
            config.micro_batch_sizes, config.max_train_batch_size, world_size, config.min_gpus,
            config.max_gpus, config.prefer_larger_batch, config.num_gpus_per_node,
            config.model_parallel_size)
    if world_size > 0 or return_microbatch:
        return final_batch, valid, micro
    return final_batch, valid
