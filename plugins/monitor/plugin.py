"""The ``monitor`` plugin: the engine's training events to the enabled monitor backends.

Enabled by any of ``tensorboard``, ``wandb``, ``csv_monitor`` or ``comet`` with
``enabled: true``. At each optimizer step (``after_step``) global rank 0 writes, with
step = ``engine.global_samples``:

- ``Train/Samples/train_loss``: the sum over the step's micro-batches of loss / gas (the losses
  ``after_backward`` receives), i.e. the mean micro-batch loss of this rank;
- ``Train/Samples/lr``: the first param group's learning rate;
- ``Train/Samples/loss_scale``: the fp16 loss scale, under fp16 only.
"""
from deepspeed.hooks import STEP_TIMERS, hookimpl
from deepspeed.monitor.config import SECTIONS, get_monitor_config
from deepspeed.monitor.monitor import MonitorMaster
from deepspeed.plugin_manager import DeepSpeedPlugin

TRAIN_LOSS = "Train/Samples/train_loss"
LR = "Train/Samples/lr"
LOSS_SCALE = "Train/Samples/loss_scale"


def step_events(engine, loss_sum):
    """The automatic events of the optimizer step that just finished."""
    step = engine.global_samples
    events = []
    if loss_sum is not None:
        events.append((TRAIN_LOSS, loss_sum.item(), step))
    lrs = engine.get_lr()
    if lrs:
        events.append((LR, float(lrs[0]), step))
    if engine.fp16_enabled():
        events.append((LOSS_SCALE, float(engine.precision.loss_scale), step))
    if engine.config.wall_clock_breakdown:  # this step's phases, as the engine timed them
        for phase in STEP_TIMERS:
            elapsed = engine.timers.last_ms(phase)
            if elapsed is not None:
                events.append((f"Train/Samples/elapsed_time_ms_{phase}", elapsed, step))
    return events


class MonitorPlugin(DeepSpeedPlugin):
    config_sections = dict(SECTIONS)
    enabled_by = "tensorboard / wandb / csv_monitor / comet with enabled: true"

    def __init__(self):
        self.monitor = None
        self._loss_sum = None  # detached tensor: no device sync until the step is written

    @hookimpl
    def deepspeed_engine_init(self, engine, config):
        self.monitor = MonitorMaster(get_monitor_config(config))

    @hookimpl
    def deepspeed_engine_monitor(self, engine):
        return self.monitor

    def _writing(self):
        return self.monitor is not None and bool(self.monitor.monitors)

    @hookimpl
    def deepspeed_after_backward(self, engine, loss):
        if not self._writing() or loss is None or not hasattr(loss, "detach"):
            return
        loss = loss.detach().float()
        self._loss_sum = loss if self._loss_sum is None else self._loss_sum + loss

    @hookimpl
    def deepspeed_after_step(self, engine):
        if not self._writing():
            return
        events = step_events(engine, self._loss_sum)
        self._loss_sum = None
        self.monitor.write_events(events)
