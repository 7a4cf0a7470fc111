"""Finding the modules a config names.

A pattern in ``modules`` / ``related_modules`` is a regular expression searched in each module's
dotted name (``re.search``), as DeepSpeed's module names are: ``"attention.self"`` matches
``bert.encoder.layer.3.attention.self.query``; ``"*"`` alone means every supported layer.
A pattern that matches nothing is almost always a typo, so it is reported with a warning naming
it (the user's model may legitimately lack a layer type, so it is not an error).
"""
import re

from deepspeed.utils.logging import logger


def get_module(model, name):
    module = model
    for part in name.split("."):
        module = getattr(module, part) if not part.isdigit() else module[int(part)]
    return module


def set_module(model, name, new):
    parent_name, _, leaf = name.rpartition(".")
    parent = get_module(model, parent_name) if parent_name else model
    if leaf.isdigit():
        parent[int(leaf)] = new
    else:
        setattr(parent, leaf, new)


def _matches(pattern, name):
    return pattern == "*" or re.search(pattern, name) is not None


def match_modules(model, patterns, accept, where, excluded=()):
    """Names of the modules ``accept(module)`` allows that one of ``patterns`` matches, in model
    order; warns naming each pattern (and ``where``: the config key) that matched none."""
    candidates = [(name, module) for name, module in model.named_modules() if name and accept(module)
                  and not any(_matches(ex, name) for ex in excluded)]
    found = []
    for pattern in patterns:
        hits = [name for name, _ in candidates if _matches(pattern, name)]
        if not hits:
            logger.warning(f"{where}: module pattern {pattern!r} matches no module of "
                           f"{type(model).__name__} that this technique applies to")
        found.extend(hit for hit in hits if hit not in found)
    return found


def _common_prefix(a, b):
    count = 0
    for x, y in zip(a.split("."), b.split(".")):
        if x != y:
            break
        count += 1
    return count


def related_for(model, name, patterns, accept, where):
    """For each related pattern, the module matching it that sits closest to ``name`` in the
    module tree (longest shared dotted prefix): ``layer.\\w+.output.dense`` related to
    ``layer.3.intermediate.dense`` is ``layer.3.output.dense``."""
    names = [n for n, m in model.named_modules() if n and n != name and accept(m)]
    related = []
    for pattern in patterns:
        hits = [n for n in names if _matches(pattern, n)]
        if not hits:
            raise ValueError(f"{where}: related module pattern {pattern!r} matches no module "
                             f"(needed next to {name})")
        best = max(_common_prefix(name, n) for n in hits)
        related.extend(n for n in hits if _common_prefix(name, n) == best)
    return related
