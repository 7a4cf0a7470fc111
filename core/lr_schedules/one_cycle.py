"""OneCycle (1Cycle policy, Smith 2018): one triangular lr cycle, then a slow decay.

Momentum moves the other way (high momentum while the lr is low), which is what lets the peak
lr be large. Momentum means Adam-style ``betas[0]``: an optimizer without ``betas`` (SGD) keeps
its momentum untouched, as upstream DeepSpeed does, because writing a `momentum` an SGD user
left at 0 would silently change the algorithm.
"""
from deepspeed.lr_schedules._base import BatchLRSchedule, check_int, check_number, per_group

# Upstream writes betas as (beta1, 0.99) throughout the schedule, replacing the optimizer's own
# beta2; kept so that a config gives the same Adam trajectory as on upstream DeepSpeed.
ONE_CYCLE_BETA2 = 0.99


def _stair_fraction(done, size, stair_count):
    """How far through a phase of `size` batches we are, in [0, 1]; with stairs, held flat on
    `stair_count` levels (500 stairs over 1000 batches = one change every 2 batches)."""
    if stair_count == 0:
        return done / size
    return (done * stair_count // size) / stair_count


class OneCycle(BatchLRSchedule):
    """lr rises from `cycle_min_lr` to `cycle_max_lr` over `cycle_first_step_size` batches,
    falls back over `cycle_second_step_size` (default: the same), then decays as
    min_lr / (1 + decay_lr_rate * d / decay_step_size) for the d-th batch after the cycle."""

    def __init__(self, optimizer, cycle_min_lr, cycle_max_lr, decay_lr_rate=0.0,
                 cycle_first_step_size=2000, cycle_second_step_size=None,
                 cycle_first_stair_count=0, cycle_second_stair_count=None, decay_step_size=0,
                 cycle_momentum=True, cycle_min_mom=0.8, cycle_max_mom=0.9, decay_mom_rate=0.0,
                 last_batch_iteration=-1):
        super().__init__(optimizer)
        self.min_lrs = per_group(self.optimizer, "cycle_min_lr", cycle_min_lr)
        self.max_lrs = per_group(self.optimizer, "cycle_max_lr", cycle_max_lr)
        self.decay_lr_rate = check_number("decay_lr_rate", decay_lr_rate)

        self.first_step_size = check_int("cycle_first_step_size", cycle_first_step_size, 1)
        self.second_step_size = (self.first_step_size if cycle_second_step_size is None else
                                 check_int("cycle_second_step_size", cycle_second_step_size, 1))
        self.total_size = self.first_step_size + self.second_step_size
        self.step_ratio = self.first_step_size / self.total_size
        self.first_stair_count = check_int("cycle_first_stair_count", cycle_first_stair_count, 0)
        self.second_stair_count = (
            self.first_stair_count if cycle_second_stair_count is None else
            check_int("cycle_second_stair_count", cycle_second_stair_count, 0))
        self.decay_step_size = check_int("decay_step_size", decay_step_size, 0)

        if not isinstance(cycle_momentum, bool):
            raise ValueError(f"cycle_momentum must be true or false, got {cycle_momentum!r}")
        if cycle_momentum and "betas" not in self.optimizer.defaults:
            self._warn(f"cycle_momentum is disabled because {type(self.optimizer).__name__} has "
                       "no 'betas' (momentum is cycled through betas[0] only)")
            cycle_momentum = False
        self.cycle_momentum = cycle_momentum
        self.min_moms = per_group(self.optimizer, "cycle_min_mom", cycle_min_mom)
        self.max_moms = per_group(self.optimizer, "cycle_max_mom", cycle_max_mom)
        self.decay_mom_rate = check_number("decay_mom_rate", decay_mom_rate)

        # A fresh schedule starts at the lr floor with betas[0] = cycle_min_mom (upstream's
        # starting point; the first step() then moves betas[0] next to cycle_max_mom).
        if last_batch_iteration == -1:
            for group, lr, mom in zip(self.optimizer.param_groups, self.min_lrs, self.min_moms):
                group["lr"] = lr
                if self.cycle_momentum:
                    group["betas"] = (mom, ONE_CYCLE_BETA2)
        self._start(last_batch_iteration)

    # ------------------------------------------------------------------ the shape
    def _in_cycle(self):
        return self.last_batch_iteration < self.total_size

    def _cycle_scale(self):
        """0 at the cycle's ends, 1 at its peak (after `cycle_first_step_size` batches)."""
        done = self.last_batch_iteration + 1
        if done <= self.first_step_size:
            return _stair_fraction(done, self.first_step_size, self.first_stair_count)
        return 1 - _stair_fraction(done - self.first_step_size, self.second_step_size,
                                   self.second_stair_count)

    def _decay_interval(self):
        """Decay intervals elapsed since the cycle ended; 0 forever when decay is off."""
        if self.decay_step_size == 0:
            return 0.0
        return (self.last_batch_iteration - self.total_size + 1) / self.decay_step_size

    # ------------------------------------------------------------------ public API
    def get_lr(self):
        if self._in_cycle():
            scale = self._cycle_scale()
            return [lo + (hi - lo) * scale for lo, hi in zip(self.min_lrs, self.max_lrs)]
        divisor = 1 + self.decay_lr_rate * self._decay_interval()
        return [lo / divisor for lo in self.min_lrs]

    def get_mom(self):
        """``[(beta1, beta2)]`` per group for the current batch, or None when not cycling."""
        if not self.cycle_momentum:
            return None
        if self._in_cycle():
            scale = self._cycle_scale()
            beta1 = [hi - (hi - lo) * scale for lo, hi in zip(self.min_moms, self.max_moms)]
        else:
            factor = 1 + self.decay_mom_rate * self._decay_interval()
            beta1 = [hi * factor for hi in self.max_moms]
        return [(b, ONE_CYCLE_BETA2) for b in beta1]

    def _write_extra(self):
        moms = self.get_mom()
        if moms is not None:
            for group, betas in zip(self.optimizer.param_groups, moms):
                group["betas"] = betas

    def step(self, batch_iteration=None):
        """Advance one batch, or jump to `batch_iteration`; writes lr (and betas)."""
        self._advance(batch_iteration)
