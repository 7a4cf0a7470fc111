"""LRRangeTest: grow the lr from a floor at a fixed rate, to find where training diverges.

The largest lr that still trains becomes `cycle_max_lr` for OneCycle (see the LRRT tutorial).
"""
from deepspeed.lr_schedules._base import BatchLRSchedule, check_int, check_number, per_group


class LRRangeTest(BatchLRSchedule):
    """lr(i) = min_lr * (1 + step_rate * interval), with interval = (i+1)/step_size, or its floor
    when `lr_range_test_staircase` holds the lr flat for `step_size` batches at a time."""

    def __init__(self, optimizer, lr_range_test_min_lr=1e-3, lr_range_test_step_size=2000,
                 lr_range_test_step_rate=1.0, lr_range_test_staircase=False,
                 last_batch_iteration=-1):
        super().__init__(optimizer)
        self.min_lr = per_group(self.optimizer, "lr_range_test_min_lr", lr_range_test_min_lr,
                                message="expected {n} lr_range_test_min_lr, got {m}")
        self.step_size = check_int("lr_range_test_step_size", lr_range_test_step_size, 1)
        self.step_rate = check_number("lr_range_test_step_rate", lr_range_test_step_rate)
        if not isinstance(lr_range_test_staircase, bool):
            raise ValueError("lr_range_test_staircase must be true or false, got "
                             f"{lr_range_test_staircase!r}")
        self.staircase = lr_range_test_staircase
        # The range test starts from its floor, whatever lr the optimizer was built with.
        if last_batch_iteration == -1:
            for group, lr in zip(self.optimizer.param_groups, self.min_lr):
                group["lr"] = lr
        self._start(last_batch_iteration)

    def _interval(self):
        batches = self.last_batch_iteration + 1
        return batches // self.step_size if self.staircase else batches / self.step_size

    def get_lr(self):
        factor = 1 + self.step_rate * self._interval()
        return [min_lr * factor for min_lr in self.min_lr]

    def step(self, batch_iteration=None):
        """Advance one batch, or jump to `batch_iteration`, and write the lr."""
        self._advance(batch_iteration)
