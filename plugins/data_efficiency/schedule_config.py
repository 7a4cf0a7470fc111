"""Checks of a curriculum pacing function's config, shared by the config sections and by
``CurriculumScheduler`` (which users also build by hand, e.g. with pipeline parallelism).

Kept apart from both so that a schedule written in the legacy ``curriculum_learning`` section,
in ``data_sampling.curriculum_learning.curriculum_metrics.<metric>`` or passed straight to the
scheduler is refused with the same message naming the missing or bad key.
"""
from typing import Any, Dict, Mapping

SCHEDULE_TYPES = ("fixed_linear", "fixed_root", "fixed_discrete", "custom")

#: schedule_config keys each pacing function needs
REQUIRED_KEYS = {
    "fixed_linear": ("total_curriculum_step", "difficulty_step"),
    "fixed_root": ("total_curriculum_step", "difficulty_step", "root_degree"),
    "fixed_discrete": ("difficulty", "max_step"),
    "custom": (),
}


class CurriculumConfigError(ValueError):
    """A curriculum schedule config is incomplete or inconsistent; the message names the key."""


def _positive_int(value, key, where):
    if isinstance(value, bool) or not isinstance(value, (int, float)) or int(value) != value \
            or value < 1:
        raise CurriculumConfigError(f"{where}.schedule_config.{key} must be a positive integer, "
                                    f"got {value!r}")
    return int(value)


def check_difficulty_range(min_difficulty, max_difficulty, where, difficulty_type="value"):
    """``min_difficulty <= max_difficulty``, percentiles within [0, 100]."""
    for key, value in (("min_difficulty", min_difficulty), ("max_difficulty", max_difficulty)):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise CurriculumConfigError(f"{where}.{key} must be a number, got {value!r}")
        if difficulty_type == "percentile" and not 0 <= value <= 100:
            raise CurriculumConfigError(f"{where}.{key} = {value} is not a percentile: "
                                        f"difficulty_type 'percentile' needs 0 <= value <= 100")
    if min_difficulty > max_difficulty:
        raise CurriculumConfigError(f"{where}: min_difficulty ({min_difficulty}) is larger than "
                                    f"max_difficulty ({max_difficulty})")


def check_schedule(schedule_type: str, schedule_config: Mapping[str, Any],
                   where: str) -> Dict[str, Any]:
    """Return ``schedule_config`` normalised (integers as int) or raise naming the bad key."""
    if schedule_type not in SCHEDULE_TYPES:
        raise CurriculumConfigError(f"{where}.schedule_type = {schedule_type!r} is not a "
                                    f"schedule; allowed: {', '.join(SCHEDULE_TYPES)}")
    config = dict(schedule_config or {})
    missing = [key for key in REQUIRED_KEYS[schedule_type] if key not in config]
    if missing:
        raise CurriculumConfigError(
            f"{where}.schedule_config is missing {', '.join(repr(k) for k in missing)}, "
            f"required by schedule_type '{schedule_type}' (it needs "
            f"{', '.join(REQUIRED_KEYS[schedule_type])})")
    if schedule_type in ("fixed_linear", "fixed_root"):
        for key in REQUIRED_KEYS[schedule_type]:
            config[key] = _positive_int(config[key], key, where)
    elif schedule_type == "fixed_discrete":
        difficulty, max_step = config["difficulty"], config["max_step"]
        if not isinstance(difficulty, (list, tuple)) or not difficulty:
            raise CurriculumConfigError(f"{where}.schedule_config.difficulty must be a non-empty "
                                        f"list, got {difficulty!r}")
        if not isinstance(max_step, (list, tuple)) or len(max_step) != len(difficulty) - 1:
            raise CurriculumConfigError(
                f"{where}.schedule_config.max_step must be a list one shorter than difficulty "
                f"(the step after which each level but the last ends): difficulty has "
                f"{len(difficulty)} levels, max_step is {max_step!r}")
        steps = [_positive_int(s, "max_step", where) for s in max_step]
        if any(b <= a for a, b in zip(steps, steps[1:])):
            raise CurriculumConfigError(f"{where}.schedule_config.max_step must increase "
                                        f"strictly, got {list(max_step)}")
        config["max_step"] = steps
        config["difficulty"] = list(difficulty)
    return config
