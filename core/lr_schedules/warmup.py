"""The warmup family: WarmupLR (warm up, then hold), WarmupDecayLR (then decay linearly to the
floor), WarmupCosineLR (warm up a *ratio* of the optimizer's own lr, then a cosine).

Warmup is over W = max(2, warmup_num_steps) batches (log(W) must not be 0), and its shape is
'log' (gamma = log(i+1)/log(W), fast early growth) or 'linear' (gamma = i/W).
"""
import math

from deepspeed.lr_schedules._base import (BatchLRSchedule, check_int, check_number,
                                          log_warmup_fraction, per_group)
from deepspeed.lr_schedules.constants import VALID_WARMUP_TYPES, WARMUP_LOG_RATE


class WarmupTypeError(ValueError, UnboundLocalError):
    """An unknown `warmup_type` for WarmupCosineLR. Upstream crashes there with an
    UnboundLocalError on the first step; this raises at construction with a clear message,
    and stays catchable as the exception upstream-era code expects."""


def _warmup_steps(warmup_num_steps):
    return max(2, check_int("warmup_num_steps", warmup_num_steps, 0))


def _warmup_fraction(warmup_type, iteration, warmup_steps):
    if warmup_type == WARMUP_LOG_RATE:
        return log_warmup_fraction(iteration, warmup_steps)
    return iteration / warmup_steps


class WarmupLR(BatchLRSchedule):
    """lr = min + (max - min) * gamma(i), gamma rising to 1 over the warmup and then held.
    The constructor leaves the optimizer's lr alone: the first ``step()`` sets it."""

    def __init__(self, optimizer, warmup_min_lr=0.0, warmup_max_lr=0.001,
                 warmup_num_steps=1000, warmup_type=WARMUP_LOG_RATE, last_batch_iteration=-1):
        super().__init__(optimizer)
        self.min_lrs = per_group(self.optimizer, "warmup_min_lr", warmup_min_lr)
        self.max_lrs = per_group(self.optimizer, "warmup_max_lr", warmup_max_lr)
        self.delta_lrs = [hi - lo for lo, hi in zip(self.min_lrs, self.max_lrs)]
        self.warmup_num_steps = _warmup_steps(warmup_num_steps)
        if warmup_type not in VALID_WARMUP_TYPES:
            self._warn(f"unknown warmup_type {warmup_type!r} (valid: {VALID_WARMUP_TYPES}); "
                       f"using {WARMUP_LOG_RATE!r}")
            warmup_type = WARMUP_LOG_RATE
        self.warmup_type = warmup_type
        self._start(last_batch_iteration)

    def _gamma(self):
        i = self.last_batch_iteration
        if i < self.warmup_num_steps:
            return _warmup_fraction(self.warmup_type, i, self.warmup_num_steps)
        return 1.0

    def get_lr(self):
        if self.last_batch_iteration < 0:
            self._warn("get_lr() called before the first step(); returning [0.0]")
            return [0.0]
        gamma = self._gamma()
        return [lo + delta * gamma for lo, delta in zip(self.min_lrs, self.delta_lrs)]

    def step(self, last_batch_iteration=None):
        """Advance one batch, or jump to `last_batch_iteration`, and write the lr."""
        self._advance(last_batch_iteration)


class WarmupDecayLR(WarmupLR):
    """WarmupLR, then gamma = (T - i) / (T - W) falls linearly to 0 at i = T and stays there."""

    def __init__(self, optimizer, total_num_steps, warmup_min_lr=0.0, warmup_max_lr=0.001,
                 warmup_num_steps=1000, warmup_type=WARMUP_LOG_RATE, last_batch_iteration=-1):
        self.total_num_steps = check_int("total_num_steps", total_num_steps, 1)
        super().__init__(optimizer, warmup_min_lr, warmup_max_lr, warmup_num_steps, warmup_type,
                         last_batch_iteration)
        if self.total_num_steps < self.warmup_num_steps:
            self._warn(f"total_num_steps {self.total_num_steps} is less than warmup_num_steps "
                       f"{self.warmup_num_steps}")

    def _gamma(self):
        i = self.last_batch_iteration
        if i < self.warmup_num_steps:
            return _warmup_fraction(self.warmup_type, i, self.warmup_num_steps)
        decay_span = max(1, self.total_num_steps - self.warmup_num_steps)
        return max(0.0, (self.total_num_steps - i) / decay_span)


class WarmupCosineLR(BatchLRSchedule):
    """ratio warms up from `warmup_min_ratio` to 1, then follows a half cosine down to
    `cos_min_ratio` at i = T - 1; lr = ratio * the group's lr at construction. Past T the cosine
    is not clamped and comes back up, as upstream's does."""

    def __init__(self, optimizer, total_num_steps, warmup_min_ratio=0.0, warmup_num_steps=1000,
                 cos_min_ratio=0.0001, warmup_type=WARMUP_LOG_RATE, last_batch_iteration=-1):
        super().__init__(optimizer)
        self.total_num_steps = check_int("total_num_steps", total_num_steps, 1)
        self.warmup_min_ratios = per_group(self.optimizer, "warmup_min_ratio", warmup_min_ratio)
        self.warmup_num_steps = _warmup_steps(warmup_num_steps)
        self.cos_min_ratio = check_number("cos_min_ratio", cos_min_ratio)
        if warmup_type not in VALID_WARMUP_TYPES:
            raise WarmupTypeError(f"WarmupCosineLR: warmup_type must be one of "
                                  f"{VALID_WARMUP_TYPES}, got {warmup_type!r}")
        self.warmup_type = warmup_type
        if self.total_num_steps < self.warmup_num_steps:
            self._warn(f"total_num_steps {self.total_num_steps} is less than warmup_num_steps "
                       f"{self.warmup_num_steps}")
        self.org_lrs = [group["lr"] for group in self.optimizer.param_groups]
        self._start(last_batch_iteration)

    def get_lr_ratio(self):
        """The per-group multiplier of the original lr for the current batch."""
        i = self.last_batch_iteration
        if i < self.warmup_num_steps:
            fraction = _warmup_fraction(self.warmup_type, i, self.warmup_num_steps)
            return [lo + fraction * (1 - lo) for lo in self.warmup_min_ratios]
        done = i - self.warmup_num_steps + 1
        span = max(1, self.total_num_steps - self.warmup_num_steps)
        cosine = (1 + math.cos(math.pi * done / span)) / 2
        ratio = max(0.0, self.cos_min_ratio + (1 - self.cos_min_ratio) * cosine)
        return [ratio] * len(self.warmup_min_ratios)

    def get_lr(self):
        if self.last_batch_iteration < 0:
            self._warn("get_lr() called before the first step(); returning [0.0]")
            return [0.0]
        return [org * ratio for org, ratio in zip(self.org_lrs, self.get_lr_ratio())]

    def step(self, last_batch_iteration=None):
        """Advance one batch, or jump to `last_batch_iteration`, and write the lr."""
        self._advance(last_batch_iteration)

