"""Which ops `setup.py` compiles ahead of time, from the `DS_BUILD_*` environment variables.

`DS_BUILD_OPS=1` selects every op; `DS_BUILD_<NAME>=1` selects one, and `DS_BUILD_<NAME>=0`
removes one from `DS_BUILD_OPS`. Only ops whose `is_compatible()` holds are compiled: the others
are reported and left to JIT loading, as the install docs promise.
"""
from __future__ import annotations

BUILD_ALL_VAR = "DS_BUILD_OPS"
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def _flag(environ, var):
    """True/False for a set variable, None when unset; anything else is a clear error."""
    if var not in environ:
        return None
    value = environ[var].strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ValueError(f"{var}={environ[var]!r} is not a switch; use 1 or 0")


def any_build_requested(environ):
    """Whether setup.py must import torch at all (it must not for a plain JIT-mode install)."""
    return any(k.startswith("DS_BUILD_") and _flag(environ, k) for k in environ)


def select_ops(builder_classes, environ):
    """(builders to compile, [(op name, reason)] skipped) for the given environment.

    Unknown `DS_BUILD_<NAME>` variables are an error naming the known ones, so a typo does not
    silently produce a JIT-only install.
    """
    builders = [cls() for cls in builder_classes]
    known = {b.BUILD_VAR: b for b in builders}
    unknown = sorted(k for k in environ if k.startswith("DS_BUILD_") and k != BUILD_ALL_VAR
                     and k not in known)
    if unknown:
        raise ValueError(f"unknown op build switch(es) {', '.join(unknown)}; known: "
                         f"{', '.join([BUILD_ALL_VAR, *sorted(known)])}")
    build_all = bool(_flag(environ, BUILD_ALL_VAR))
    selected, skipped = [], []
    for builder in builders:
        own = _flag(environ, builder.BUILD_VAR)
        if not (own if own is not None else build_all):
            continue
        if not getattr(builder, "PREBUILDABLE", True):
            skipped.append((builder.NAME, "compiled at first use (Triton), nothing to pre-build"))
        elif builder.is_compatible(verbose=False):
            selected.append(builder)
        else:
            skipped.append((builder.NAME, builder.incompatible_reason or "incompatible"))
    return selected, skipped
