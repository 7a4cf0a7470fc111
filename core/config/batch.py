"""The batch-size triangle: train_batch_size = micro_batch_per_gpu * grad_accum_steps * world_size.

Users give any two (or just one of the batch sizes) and DeepSpeed derives the rest, exactly as the
docs and the HF integration expect; an inconsistent or non-divisible combination is an error that
shows the numbers, because a silently rounded batch size changes the training run.
"""
from typing import Optional, Tuple

from deepspeed.config.errors import DeepSpeedConfigError

TBS = "train_batch_size"
MICRO = "train_micro_batch_size_per_gpu"
GAS = "gradient_accumulation_steps"


def _check_positive(name: str, value: Optional[int]) -> None:
    if value is not None and value <= 0:
        raise DeepSpeedConfigError(f"{name}: {value} has to be greater than 0")


def _divide(numerator: int, numerator_name: str, denominator: int, denominator_text: str) -> int:
    if numerator % denominator:
        raise DeepSpeedConfigError(
            f"{numerator_name} ({numerator}) is not divisible by {denominator_text} = {denominator}; "
            f"check batch related parameters")
    return numerator // denominator


def resolve_batch_triangle(train_batch_size: Optional[int], micro_batch: Optional[int],
                           grad_accum: Optional[int], world_size: int) -> Tuple[int, int, int]:
    """Return (train_batch_size, train_micro_batch_size_per_gpu, gradient_accumulation_steps)."""
    if not isinstance(world_size, int) or isinstance(world_size, bool) or world_size <= 0:
        raise DeepSpeedConfigError(f"data-parallel world_size must be a positive int, got {world_size!r}")
    _check_positive(TBS, train_batch_size)
    _check_positive(MICRO, micro_batch)
    _check_positive(GAS, grad_accum)

    tbs, micro, gas = train_batch_size, micro_batch, grad_accum
    if tbs is not None and micro is not None and gas is not None:
        pass
    elif tbs is not None and micro is not None:
        gas = _divide(tbs, TBS, micro * world_size,
                      f"{MICRO} ({micro}) * world_size ({world_size})")
    elif tbs is not None and gas is not None:
        micro = _divide(tbs, TBS, gas * world_size, f"{GAS} ({gas}) * world_size ({world_size})")
    elif micro is not None and gas is not None:
        tbs = micro * gas * world_size
    elif tbs is not None:
        gas = 1
        micro = _divide(tbs, TBS, world_size, f"world_size ({world_size})")
    elif micro is not None:
        gas = 1
        tbs = micro * world_size
    else:
        raise DeepSpeedConfigError(f"Either {TBS} or {MICRO} needs to be provided")

    if tbs != micro * gas * world_size:
        raise DeepSpeedConfigError(
            f"Check batch related parameters. {TBS} is not equal to micro_batch_per_gpu * "
            f"gradient_acc_step * world_size: {tbs} != {micro} * {gas} * {world_size} "
            f"(= {micro * gas * world_size})")
    return tbs, micro, gas
