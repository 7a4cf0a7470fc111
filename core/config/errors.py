"""The one exception type of the config system, and how key paths are written in messages.

Every config problem surfaces as a `DeepSpeedConfigError` so callers (the engine, the HF bridge,
a plugin) can catch config mistakes without also catching unrelated `ValueError`s from torch. It
still *is* a `ValueError`, because upstream raised `ValueError`/`AssertionError` for the same
mistakes and user code written against that keeps working.
"""
import difflib
from typing import Iterable, List, Optional, Sequence, Union

PathPart = Union[str, int]


class DeepSpeedConfigError(ValueError):
    """A config the user (or a plugin) gave is not acceptable.

    `problems` holds one line per offending key path so that a config with several mistakes is
    fixed in one round trip instead of one error per run.
    """

    def __init__(self, problems: Union[str, Sequence[str]], source: Optional[str] = None,
                 note: Optional[str] = None):
        self.problems: List[str] = [problems] if isinstance(problems, str) else list(problems)
        self.source = source
        self.note = note
        super().__init__(self._render())

    def _render(self) -> str:
        where = f" (from {self.source})" if self.source else ""
        if len(self.problems) == 1:
            text = f"Invalid DeepSpeed config{where}: {self.problems[0]}"
        else:
            lines = "\n".join(f"  - {p}" for p in self.problems)
            text = f"Invalid DeepSpeed config{where}: {len(self.problems)} problems\n{lines}"
        if self.note:
            text += f"\n{self.note}"
        return text


class ConfigDeprecationWarning(FutureWarning):
    """A deprecated config key was used. A FutureWarning so end users see it by default."""


def format_path(parts: Iterable[PathPart]) -> str:
    """`('optimizer', 'params', 'betas', 0)` -> `optimizer.params.betas[0]`."""
    out = ""
    for part in parts:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out or "<root>"


def closest_key(key: str, known: Iterable[str]) -> Optional[str]:
    """The known key a typo most likely meant, or None when nothing is close enough."""
    matches = difflib.get_close_matches(key, sorted(set(known)), n=1, cutoff=0.6)
    return matches[0] if matches else None


def unknown_key_problem(parts: Sequence[PathPart], known: Iterable[str]) -> str:
    """The message for a key no section declares: name the path and the likely intended key."""
    known = sorted(set(known))
    path = format_path(parts)
    guess = closest_key(str(parts[-1]), known)
    if guess is not None:
        return f"{path}: unknown key; did you mean '{format_path(list(parts[:-1]) + [guess])}'?"
    listing = ", ".join(known) if known else "(none)"
    return f"{path}: unknown key; keys allowed here: {listing}"
