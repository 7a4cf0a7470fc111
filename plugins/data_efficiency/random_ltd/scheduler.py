"""The random-LTD schedule: how many tokens each LTD layer keeps at a step, and the layer-token
count training consumed (the cost random-LTD saves).

    r(t) = min(max, floor(t / require_steps * (max - min) + min) rounded down to seq_per_step)
    per step: global_batch * (r * ltd_layers + max * (total_layers - ltd_layers)) layer tokens

With ``layer_token_lr_schedule`` the learning rate follows the consumed layer tokens
(``layer_token_lr_factor``).

Upstream: ``deepspeed.runtime.data_pipeline.data_routing.scheduler``.
"""
import math

import torch


def consumed_layer_tokens(global_batch, reserved, max_value, ltd_layers, total_layers):
    return global_batch * (reserved * ltd_layers + max_value * (total_layers - ltd_layers))


def layer_token_lr_factor(tokens, schedule):
    """The fraction of the peak learning rate after ``tokens`` consumed layer tokens
    (``schedule``: a ``layer_token_lr_schedule`` section): linear warmup, then cosine decay to 0
    at ``total_layer_token``."""
    warmup, total = schedule.warmup_layer_token, schedule.total_layer_token
    if tokens < warmup:
        return tokens / warmup
    progress = min(1.0, (tokens - warmup) / (total - warmup))
    return 0.5 * (1.0 + math.cos(math.pi * progress))


class RandomLTDScheduler:
    def __init__(self, config, global_batch_size=1, seed=1234):
        """``config``: the ``random_ltd`` section (a ``RandomLTDConfig`` or its dict)."""
        if isinstance(config, dict):
            from ..config import RandomLTDConfig

            config = RandomLTDConfig(**{"enabled": True, **config})
        schedule = config.random_ltd_schedule
        self.config = config
        self.min_value, self.max_value = schedule.min_value, schedule.max_value
        self.require_steps = schedule.schedule_config["require_steps"]
        self.seq_per_step = schedule.schedule_config["seq_per_step"]
        self.total_layer_num = config.total_layer_num
        self.random_ltd_layer_num = config.random_ltd_layer_num
        self.layer_ids = list(config.random_ltd_layer_id)
        self.global_batch_size = global_batch_size
        self.current_seq = self.min_value
        self.consumed_layer_tokens = 0
        self.curr_step = -1
        self.generator = torch.Generator().manual_seed(seed)

    def get_value(self, global_steps):
        fraction = global_steps / self.require_steps
        value = math.floor(fraction * (self.max_value - self.min_value) + self.min_value)
        value -= value % self.seq_per_step
        return min(value, self.max_value)

    def get_current_seq(self):
        return self.current_seq

    def update_seq(self, global_steps):
        """At each training forward: the kept length for step ``global_steps``, and that
        step's layer tokens counted once."""
        if self.current_seq < self.max_value:
            self.current_seq = self.get_value(global_steps)
        if global_steps != self.curr_step:
            self.consumed_layer_tokens += consumed_layer_tokens(
                self.global_batch_size, self.current_seq, self.max_value,
                self.random_ltd_layer_num, self.total_layer_num)
            self.curr_step = global_steps
        return self.current_seq

    def state_dict(self):
        return {"current_seq": self.current_seq, "consumed_layer_tokens":
                self.consumed_layer_tokens, "curr_step": self.curr_step,
                "generator": self.generator.get_state()}

    def load_state_dict(self, state):
        self.current_seq = int(state["current_seq"])
        self.consumed_layer_tokens = int(state["consumed_layer_tokens"])
        self.curr_step = int(state["curr_step"])
        if "generator" in state:
            self.generator.set_state(state["generator"])
