"""``CurriculumScheduler``: the pacing function that gives the largest accepted difficulty at a
training step (upstream: ``deepspeed.runtime.data_pipeline.curriculum_scheduler``).

    d(t) = floor((t / T) ** (1 / root_degree) * (max - min) + min)
    d   -= d % difficulty_step;  d = min(d, max)              # fixed_root; fixed_linear: root 1

``fixed_discrete`` is piecewise constant: level i until step ``max_step[i]``, the last level
after; ``custom`` asks a user callback (``set_custom_get_difficulty``). The engine calls
``update_difficulty(global_steps + 1)`` on each training forward while the current difficulty is
below the maximum, so a finished curriculum stops being evaluated.
"""
import math

from deepspeed.utils.logging import logger

from .schedule_config import (CurriculumConfigError, check_difficulty_range, check_schedule)


class CurriculumScheduler:
    def __init__(self, config, where="curriculum_learning"):
        """``config``: ``min_difficulty``, ``max_difficulty``, ``schedule_type`` and
        ``schedule_config`` (a dict, or a config model with those attributes)."""
        if not isinstance(config, dict):
            config = config.model_dump() if hasattr(config, "model_dump") else dict(vars(config))
        for key in ("min_difficulty", "max_difficulty", "schedule_type"):
            if config.get(key) is None:
                raise CurriculumConfigError(f"{where} is missing '{key}', which every curriculum "
                                            f"schedule needs")
        self.where = where
        check_difficulty_range(config["min_difficulty"], config["max_difficulty"], where,
                               config.get("difficulty_type", "value"))
        self.min_difficulty = config["min_difficulty"]
        self.max_difficulty = config["max_difficulty"]
        self.schedule_type = config["schedule_type"]
        self.schedule = check_schedule(self.schedule_type, config.get("schedule_config"), where)
        self.current_difficulty = self.min_difficulty
        self.custom_get_difficulty = None
        step = self.schedule.get("difficulty_step")
        if step is not None and step % 8 != 0:
            logger.warning(f"{where}: difficulty_step {step} is not a multiple of 8; with fp16 "
                           f"a multiple of 8 (16 for int8) uses Tensor Cores best")

    # ------------------------------------------------------------------ state
    def get_current_difficulty(self):
        return self.current_difficulty

    def set_current_difficulty(self, difficulty):
        self.current_difficulty = difficulty

    def set_custom_get_difficulty(self, schedule_function):
        """``schedule_function(global_steps) -> difficulty``, for ``schedule_type: custom``."""
        if not callable(schedule_function):
            raise TypeError(f"{self.where}: the custom schedule must be callable, got "
                            f"{type(schedule_function).__name__}")
        self.custom_get_difficulty = schedule_function

    def get_state(self):
        """What a checkpoint keeps (plain values: checkpoints load with weights_only=True)."""
        return {"current_difficulty": self.current_difficulty,
                "min_difficulty": self.min_difficulty, "max_difficulty": self.max_difficulty,
                "schedule_type": self.schedule_type}

    def set_state(self, state):
        self.current_difficulty = state["current_difficulty"]

    state_dict = get_state
    load_state_dict = set_state

    # ------------------------------------------------------------------ pacing
    def _fixed_root(self, global_steps, root_degree):
        total = self.schedule["total_curriculum_step"]
        fraction = min(1.0, max(0.0, global_steps / total)) ** (1.0 / root_degree)
        value = math.floor(fraction * (self.max_difficulty - self.min_difficulty)
                           + self.min_difficulty)
        value -= value % self.schedule["difficulty_step"]
        return min(value, self.max_difficulty)

    def _fixed_discrete(self, global_steps):
        for level, last_step in zip(self.schedule["difficulty"], self.schedule["max_step"]):
            if global_steps <= last_step:
                return level
        return self.schedule["difficulty"][-1]

    def get_difficulty(self, global_steps):
        if self.schedule_type == "fixed_linear":
            return self._fixed_root(global_steps, 1)
        if self.schedule_type == "fixed_root":
            return self._fixed_root(global_steps, self.schedule["root_degree"])
        if self.schedule_type == "fixed_discrete":
            return self._fixed_discrete(global_steps)
        if self.custom_get_difficulty is None:
            raise CurriculumConfigError(
                f"{self.where}.schedule_type is 'custom' but no schedule function was set: call "
                f"engine.set_custom_curriculum_learning_schedule(...) (or the scheduler's "
                f"set_custom_get_difficulty) before training")
        return self.custom_get_difficulty(global_steps)

    def update_difficulty(self, global_steps):
        if self.current_difficulty < self.max_difficulty:
            self.current_difficulty = self.get_difficulty(global_steps)
        return self.current_difficulty
