"""A disk cache of traced model descriptions, so that planning a known model again is instant.

Describing a Hugging Face config costs a few seconds, nearly all of it importing
``transformers`` and tracing one- and two-layer models on the meta device; the plan itself is
arithmetic. Users run ``ds_plan`` on the same model many times (other clusters, batch sizes,
search spaces), so the description of a preset or config dict is kept as JSON under
``$DS_PLAN_CACHE`` (default ``$XDG_CACHE_HOME/deepspeed/plan``, i.e. ``~/.cache/deepspeed/plan``;
``DS_PLAN_CACHE=0`` turns the cache off).

A file is named after a hash of everything its figures depend on: the config values, the
sequence length, the installed ``transformers`` version and the source of the code that traces
(``model_spec.py`` and the flops profiler's files, named by the caller), so a change to any of them misses the
cache instead of reading stale figures. Files are plain JSON (never pickles), written to a
temporary name and renamed, and a file that does not read back as a description is ignored
and rewritten.
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
import tempfile
from importlib import metadata
from pathlib import Path
from typing import Callable, Optional

CACHE_ENV = "DS_PLAN_CACHE"


def cache_dir() -> Optional[Path]:
    """Where descriptions are kept, or None when ``DS_PLAN_CACHE=0`` switched the cache off."""
    chosen = os.environ.get(CACHE_ENV, "")
    if chosen == "0":
        return None
    if chosen:
        return Path(chosen)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "deepspeed" / "plan"


@functools.lru_cache(maxsize=8)
def _fingerprint(sources: tuple) -> str:
    digest = hashlib.sha256()
    for source in sources:
        digest.update(Path(source).read_bytes())
    return digest.hexdigest()


def _transformers_version() -> str:
    try:
        return metadata.version("transformers")
    except metadata.PackageNotFoundError:
        return "none"


def cache_key(config: dict, seq_len: int, sources: tuple) -> str:
    text = json.dumps({"config": config, "seq_len": seq_len, "code": _fingerprint(sources),
                       "transformers": _transformers_version()}, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def _read(path: Path, spec_class):
    try:
        values = json.loads(path.read_text(encoding="utf-8"))
        names = {f.name for f in dataclasses.fields(spec_class)}
        if not isinstance(values, dict) or set(values) != names:
            return None
        return spec_class(**{k: tuple(v) if isinstance(v, list) else v for k, v in values.items()})
    except (OSError, ValueError, TypeError):
        return None  # unreadable or from another layout of the class: describe again


def _write(path: Path, spec) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as out:
            json.dump(dataclasses.asdict(spec), out)
        os.replace(temporary, path)
    except BaseException:
        os.unlink(temporary)
        raise


def cached_spec(config: dict, seq_len: int, describe: Callable[[], object], spec_class,
                sources: tuple):
    """``describe()``'s description (a ``spec_class`` dataclass) of ``config`` at ``seq_len``,
    from the cache when it holds one; ``sources``: the files of the code that describes (their
    content is part of the key). A cache that cannot be written (read-only home) costs only
    the speed-up."""
    folder = cache_dir()
    if folder is None:
        return describe()
    path = folder / f"{cache_key(config, seq_len, tuple(str(s) for s in sources))}.json"
    spec = _read(path, spec_class) if path.is_file() else None
    if spec is not None:
        return spec
    spec = describe()
    try:
        _write(path, spec)
    except OSError as error:
        from deepspeed.utils.logging import logger

        logger.warning("ds_plan: cannot write the model description cache %s (%s); set %s to "
                       "a writable folder, or 0 to switch it off", path, error, CACHE_ENV)
    return spec
