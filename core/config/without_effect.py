"""Documented keys this implementation accepts but does nothing with, and the one warning about
them; and the keys it refuses.

A config written for upstream DeepSpeed has to load here unchanged, so such keys are accepted;
ignoring them silently would let a user believe, say, that their fp16 masters halve the memory.
Every section model (core or plugin) lists its own in the class attribute ``without_effect``
(``{key path: why it has no effect}``; a path may reach into a nested section,
``"offload_optimizer.fast_init"``), and ``warn_without_effect`` says so once per key per process
when a config sets one to anything but its default. ``validate_config`` calls it for the core keys
and for every plugin section, so plugins only fill in their table.

A key that cannot work on this build and would mislead if accepted (a feature of another
platform) is listed in ``refused`` instead (same shape): every section model refuses a value
other than the default there when it validates (``deepspeed.config.model.refused_keys``).
"""
import threading
from typing import List, Optional, Tuple

from deepspeed.config.model import MISSING, leaf

_lock = threading.Lock()
_warned = set()  # full key paths already reported by this process

def keys_without_effect(model, prefix: str = "") -> List[Tuple[str, str]]:
    """(full key path, reason) for every listed key `model` (and the sections inside it) sets to
    a value other than its default."""
    from deepspeed.config.model import DeepSpeedConfigModel

    found = []
    for path, reason in getattr(type(model), "without_effect", {}).items():
        value, default = leaf(model, path)
        if value is not MISSING and value != default:
            found.append((f"{prefix}.{path}" if prefix else path, reason))
    for name in type(model).model_fields:
        sub = getattr(model, name, None)
        where = f"{prefix}.{name}" if prefix else name
        if isinstance(sub, DeepSpeedConfigModel):
            found.extend(keys_without_effect(sub, where))
        elif isinstance(sub, dict):  # user-named groups ({"wq1": {...}})
            for key, item in sub.items():
                if isinstance(item, DeepSpeedConfigModel):
                    found.extend(keys_without_effect(item, f"{where}.{key}"))
    return found


def warn_without_effect(model, prefix: Optional[str] = "") -> List[str]:
    """Warn (``logger.warning``) once per process for each key of `model` that is set but has no
    effect here, naming the key path and why. Returns the paths warned about now."""
    from deepspeed.utils.logging import logger  # lazily: deepspeed.utils sits above the config

    warned_now = []
    for path, reason in keys_without_effect(model, prefix or ""):
        with _lock:
            if path in _warned:
                continue
            _warned.add(path)
        logger.warning(f"{path} has no effect here: {reason}")
        warned_now.append(path)
    return warned_now


def reset_without_effect_warnings() -> None:
    """Forget what was already reported (tests that check the warning)."""
    with _lock:
        _warned.clear()
