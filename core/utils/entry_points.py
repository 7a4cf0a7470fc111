"""Entry-point discovery shared by plugins, accelerators and op builders.

Built-in and third-party extensions are found the same way, through installed distributions'
entry points, so `pip install` of an extension is all it takes to add one. When two
distributions register the same name, the one that is not deepspeed itself wins: that is how
an extension replaces a built-in without editing this package.
"""
from __future__ import annotations

import functools
import importlib.metadata
import os
import sys

_OWN_DISTRIBUTION = "deepspeed"


def scan_key():
    """What an entry-point scan depends on: ``sys.path`` with each entry's modification time
    (installing or removing a distribution adds or removes a folder in one of them, which
    changes it), and the ``entry_points`` function itself (tests replace it). Reading every
    installed distribution's metadata costs ~20 ms, and each ``deepspeed.initialize`` asks;
    a scan is redone only when this key changes."""
    state = []
    for entry in sys.path:
        try:
            mtime = os.stat(entry or ".").st_mtime_ns
        except OSError:
            mtime = None
        state.append((entry, mtime))
    return importlib.metadata.entry_points, tuple(state)


def rescanned_on_install(read):
    """``read(*args)`` (a dict) kept per arguments until ``scan_key()`` changes; each caller
    gets its own copy."""
    kept = {}  # args -> (scan_key() when read, result)

    @functools.wraps(read)
    def cached(*args):
        key = scan_key()
        hit = kept.get(args)
        if hit is None or hit[0] != key:
            hit = kept[args] = (key, read(*args))
        return dict(hit[1])

    return cached


def distribution_of(entry_point):
    """(name, version) of the distribution that registered ``entry_point``."""
    dist = getattr(entry_point, "dist", None)  # absent before Python 3.10
    if dist is None:
        return "?", "?"
    return dist.metadata["Name"] or "?", getattr(dist, "version", "?")


def _is_builtin(entry_point):
    return distribution_of(entry_point)[0].lower().replace("_", "-") == _OWN_DISTRIBUTION


@rescanned_on_install
def entry_points_of(group):
    """{name: EntryPoint} of one group; packages installed at runtime count (see ``scan_key``)."""
    found = importlib.metadata.entry_points()
    if hasattr(found, "select"):
        found = found.select(group=group)
    else:  # Python 3.9 returns a dict keyed by group
        found = found.get(group, ())
    chosen = {}
    for entry_point in found:
        previous = chosen.get(entry_point.name)
        if previous is None or (_is_builtin(previous) and not _is_builtin(entry_point)):
            chosen[entry_point.name] = entry_point
    return dict(sorted(chosen.items()))
