"""What every DeepSpeed LR schedule shares: a batch counter, and writing one lr per param group.

DeepSpeed's schedules count *batches* (`last_batch_iteration`, -1 = not started) rather than
epochs, so a resumed job can jump straight to batch N; the formulas live in the subclasses as
a pure function of that counter (`get_lr()`), and this base does the bookkeeping around it.
Every schedule checks its inputs with ``deepspeed.utils.arg_checks``, so bad config values are
rejected with the same wording (the value, the key, and what is allowed).
"""
import math

import torch

from deepspeed.utils.arg_checks import check_int, check_number  # noqa: F401 (re-exported)
from deepspeed.utils.logging import logger


def resolve_optimizer(optimizer):
    """The torch optimizer whose param groups carry the lr: wrappers (ZeRO, fp16) expose it as
    ``.optimizer``, and writing there is what the wrapped step actually reads."""
    if isinstance(optimizer, torch.optim.Optimizer):
        return optimizer
    inner = getattr(optimizer, "optimizer", None)
    if isinstance(inner, torch.optim.Optimizer):
        return inner
    raise TypeError(f"{type(optimizer).__name__} is not a subclass of torch.optim.Optimizer "
                    "(nor a wrapper exposing one as `.optimizer`)")


def per_group(optimizer, name, value, message=None):
    """One value per param group: a scalar is replicated, a list must match the group count."""
    count = len(optimizer.param_groups)
    if isinstance(value, (list, tuple)):
        if len(value) != count:
            raise ValueError(message.format(n=count, m=len(value)) if message
                             else f"expected {count} value for {name}, got {value}")
        return [check_number(f"{name}[{i}]", v) for i, v in enumerate(value)]
    return [check_number(name, value)] * count


def log_warmup_fraction(iteration, warmup_steps):
    """log(i+1)/log(W): fast at first, reaching 1 at i = W-1."""
    return math.log(iteration + 1) / math.log(warmup_steps)


class BatchLRSchedule:
    """Base of the five schedules. Subclasses set their parameters, then call
    ``_start(last_batch_iteration)``, and implement ``get_lr()`` for the current counter."""

    def __init__(self, optimizer):
        self.optimizer = resolve_optimizer(optimizer)
        self._last_lr = None

    def _start(self, last_batch_iteration):
        """A resumed schedule (counter >= 0) writes the lr it would be at, so the first optimizer
        step after resuming uses the same lr as the uninterrupted run."""
        self.last_batch_iteration = check_int("last_batch_iteration", last_batch_iteration, -1)
        if self.last_batch_iteration >= 0:
            self._apply()

    def get_lr(self):
        raise NotImplementedError(f"{type(self).__name__} must implement get_lr()")

    def get_last_lr(self):
        """The lr list the last ``step()`` wrote (same contract as torch schedulers)."""
        assert self._last_lr is not None, "need to call step() first"
        return self._last_lr

    def _advance(self, batch_iteration):
        if batch_iteration is None:
            batch_iteration = self.last_batch_iteration + 1
        self.last_batch_iteration = check_int("batch_iteration", batch_iteration, -1)
        self._apply()

    def _apply(self):
        for group, lr in zip(self.optimizer.param_groups, self.get_lr()):
            group["lr"] = lr
        self._write_extra()
        self._last_lr = [group["lr"] for group in self.optimizer.param_groups]

    def _write_extra(self):
        """Hook for schedules that drive more than the lr (OneCycle's momentum)."""

    def state_dict(self):
        return {"last_batch_iteration": self.last_batch_iteration}

    def load_state_dict(self, sd):
        """Restores the counter and rewrites the lr for it, so a resumed optimizer is in step
        even when its own state was not restored."""
        if "last_batch_iteration" not in sd:
            raise KeyError(f"{type(self).__name__}.load_state_dict: missing 'last_batch_iteration' "
                           f"(got keys {sorted(sd)})")
        self.last_batch_iteration = check_int("last_batch_iteration",
                                              sd["last_batch_iteration"], -1)
        if self.last_batch_iteration >= 0:
            self._apply()

    def _warn(self, message):
        logger.warning(f"{type(self).__name__}: {message}")
