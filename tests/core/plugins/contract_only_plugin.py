"""Replacements for the built-in ``monitor`` and ``comms_logger`` plugins, written from
``deepspeed.hooks`` alone (plus pydantic for their config sections, as the
``deepspeed_config_sections`` hook asks): the proof that the hook file is the whole contract.
``test_contract_only_plugins`` registers them under the built-ins' names."""
from typing import List

import pydantic

from deepspeed.hooks import STEP_TIMERS, hookimpl


class MonitorSection(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid")
    enabled: bool = False
    output_path: str = ""
    job_name: str = "job"


class ListWriter:
    """A ``deepspeed.hooks.Monitor`` that keeps the events in memory."""

    def __init__(self):
        self.events = []

    def write_events(self, events):
        self.events.extend(events)


class ContractMonitor:
    """Owns the monitor sections; writes this step's loss and the step timers' last values."""

    def __init__(self):
        self.writer = ListWriter()
        self.losses: List[float] = []

    @hookimpl
    def deepspeed_config_sections(self):
        return {key: MonitorSection for key in ("tensorboard", "wandb", "csv_monitor", "comet")}

    @hookimpl
    def deepspeed_engine_monitor(self, engine):
        return self.writer

    @hookimpl
    def deepspeed_after_backward(self, engine, loss):
        self.losses.append(float(loss))

    @hookimpl
    def deepspeed_after_step(self, engine):
        step = engine.global_steps
        events = [("loss", sum(self.losses), step)]
        self.losses = []
        for phase in STEP_TIMERS:
            elapsed = engine.timers.last_ms(phase)
            if elapsed is not None:
                events.append((f"ms/{phase}", elapsed, step))
        self.writer.write_events(events)


class CommsSection(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid")
    enabled: bool = False
    verbose: bool = False
    prof_all: bool = True
    debug: bool = False
    prof_ops: List[str] = []


class CountingLogger:
    """A ``deepspeed.hooks.CommsLogger``: counts ops by name."""

    def __init__(self, settings=None):
        self.settings = settings
        self.counts = {}

    def __call__(self, record):
        self.counts[record.op] = self.counts.get(record.op, 0) + 1

    def log_summary(self, show_straggler=False, return_dict=False):
        return dict(self.counts)


class ContractCommsLogger:
    def __init__(self):
        self.logger = CountingLogger()

    @hookimpl
    def deepspeed_config_sections(self):
        return {"comms_logger": CommsSection}

    @hookimpl
    def deepspeed_comm_op(self, record):
        self.logger(record)

    @hookimpl
    def deepspeed_comm_summary(self, engine, show_straggler, return_dict):
        return {"from": "contract", **self.logger.log_summary()}

    @hookimpl
    def deepspeed_comms_logger(self, settings):
        return CountingLogger(settings)


class ExtrasSection(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid")
    enabled: bool = False
    momentum: float = 0.0


class StepsSeen:
    """A ``deepspeed.hooks.Stateful``: the last optimizer step this plugin saw."""

    def __init__(self):
        self.steps = None

    def state_dict(self):
        return {"steps": self.steps}

    def load_state_dict(self, state_dict):
        self.steps = state_dict["steps"]


class ContractExtras:
    """Builds an optimizer type the core does not know, and keeps a counter in checkpoints."""

    def __init__(self):
        self.momentum = 0.0
        self.seen = StepsSeen()

    @hookimpl
    def deepspeed_config_sections(self):
        return {"contract_extras": ExtrasSection}

    @hookimpl
    def deepspeed_engine_init(self, engine, config):
        self.momentum = config.section("contract_extras").momentum

    @hookimpl
    def deepspeed_build_optimizer(self, name, params, optimizer_params):
        if name != "ContractSGD":
            return None
        import torch

        return torch.optim.SGD(params, momentum=self.momentum, **optimizer_params)

    @hookimpl
    def deepspeed_after_step(self, engine):
        self.seen.steps = engine.global_steps

    @hookimpl
    def deepspeed_stateful(self):
        return {"seen": self.seen}
