"""fp16 loss scaling: a static scale, or DeepSpeed's dynamic scaler with hysteresis.

The dynamic algorithm (documented by the `fp16` config keys):
- start at ``2**initial_scale_power``;
- on an overflow the step is skipped; the scale is divided by 2 (never below
  ``min_loss_scale``) once ``hysteresis`` overflows have been tolerated, otherwise only the
  remaining hysteresis is decremented;
- after ``loss_scale_window`` iterations without overflow (counted from the last overflow)
  the scale doubles and the hysteresis is refilled; with ``consecutive_hysteresis`` the
  hysteresis is refilled after every clean step instead, so only consecutive overflows count.
"""
from deepspeed.utils.logging import logger


class LossScaler:
    """A fixed scale: overflowing steps are still skipped, the scale never moves."""

    dynamic = False

    def __init__(self, scale=1.0):
        self.cur_scale = float(scale)

    @property
    def loss_scale(self):
        return self.cur_scale

    def update_scale(self, overflow):
        """Record one boundary step; returns nothing (a static scale has no state to move)."""

    def state_dict(self):
        return {"cur_scale": self.cur_scale}

    def load_state_dict(self, state):
        self.cur_scale = float(state["cur_scale"])


class DynamicLossScaler(LossScaler):
    dynamic = True

    def __init__(self, init_scale=2.0 ** 16, scale_factor=2.0, scale_window=1000, min_scale=1.0,
                 delayed_shift=1, consecutive_hysteresis=False, raise_error_at_min_scale=False):
        super().__init__(init_scale)
        self.scale_factor = float(scale_factor)
        self.scale_window = int(scale_window)
        self.min_scale = float(min_scale)
        self.delayed_shift = int(delayed_shift)
        self.cur_hysteresis = int(delayed_shift)
        self.consecutive_hysteresis = bool(consecutive_hysteresis)
        self.raise_error_at_min_scale = raise_error_at_min_scale
        self.cur_iter = 0
        self.last_overflow_iter = -1

    def update_scale(self, overflow):
        if overflow:
            if self.delayed_shift == 1 or self.cur_hysteresis == 1:
                if self.cur_scale <= self.min_scale and self.raise_error_at_min_scale:
                    raise RuntimeError("Current loss scale already at minimum - cannot decrease "
                                       "scale anymore. Exiting run.")
                self.cur_scale = max(self.cur_scale / self.scale_factor, self.min_scale)
            else:
                self.cur_hysteresis -= 1
            self.last_overflow_iter = self.cur_iter
        else:
            if self.consecutive_hysteresis:
                self.cur_hysteresis = self.delayed_shift
            if (self.cur_iter - self.last_overflow_iter) % self.scale_window == 0:
                if not self.consecutive_hysteresis:
                    self.cur_hysteresis = self.delayed_shift
                self.cur_scale *= self.scale_factor
        self.cur_iter += 1

    def state_dict(self):
        return {"cur_scale": self.cur_scale, "cur_iter": self.cur_iter,
                "last_overflow_iter": self.last_overflow_iter,
                "cur_hysteresis": self.cur_hysteresis}

    def load_state_dict(self, state):
        self.cur_scale = float(state["cur_scale"])
        self.cur_iter = int(state["cur_iter"])
        self.last_overflow_iter = int(state["last_overflow_iter"])
        self.cur_hysteresis = int(state["cur_hysteresis"])


def loss_scaler_from_config(config):
    """The scaler the ``fp16`` section asks for (``loss_scale`` 0 = dynamic)."""
    if config.loss_scale == 0:
        args = config.dynamic_loss_scale_args
        return DynamicLossScaler(init_scale=args["init_scale"], scale_window=args["scale_window"],
                                 min_scale=args["min_scale"], delayed_shift=args["delayed_shift"],
                                 consecutive_hysteresis=args["consecutive_hysteresis"])
    return LossScaler(config.loss_scale)


def log_overflow(rank, attempted, now):
    """The documented line users grep for when fp16 training stalls."""
    logger.info(f"[deepspeed] OVERFLOW! Rank {rank} Skipping step. Attempted loss scale: "
                f"{attempted}, reducing to {now}")
