"""Crash-safe file writes and weights-only reads: the only way this package touches the disk.

A checkpoint that a crash can half-write is worse than none: the next job resumes from garbage.
Every file is therefore written under a hidden temporary name in its final directory, flushed
to disk, and ``os.replace``d onto its final name (atomic on POSIX and Windows), so a reader sees
either the old complete file or the new complete one, never a torn one.

Every file is also checked to load with ``torch.load(weights_only=True)`` *before* it is
written: loading a checkpoint must never execute code from it, and a state that could only be
read back with a full unpickler should fail at save time, not weeks later at resume time.
"""
import contextlib
import contextvars
import io
import os
import pickle
import uuid
from collections.abc import Mapping

import torch

from deepspeed.checkpoint.errors import CheckpointFormatError

_TMP_MARK = ".tmp-"
# The checkpoint engine a ``save_checkpoint`` call writes through: plugins write their files
# with ``atomic_torch_save`` from inside the save hooks, and those files must go the same way
# (same format, same background writer) as the core's own.
_ACTIVE_WRITER = contextvars.ContextVar("deepspeed_checkpoint_writer", default=None)


def temporary_name(path):
    """A hidden, unique sibling of ``path``: same directory (so ``os.replace`` stays atomic) and
    unique per process and call (so two writers never share a temporary)."""
    directory, name = os.path.split(os.fspath(path))
    return os.path.join(directory, f".{name}{_TMP_MARK}{os.getpid()}-{uuid.uuid4().hex[:12]}")


def is_temporary_name(name):
    return name.startswith(".") and _TMP_MARK in name


def _fsync_directory(directory):
    """Make the rename itself durable; platforms without directory fds simply skip it."""
    if not hasattr(os, "O_DIRECTORY"):
        return
    fd = os.open(directory or ".", os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_atomically(path, write):
    def write_to(tmp):
        with open(tmp, "wb") as f:
            write(f)

    write_path_atomically(path, write_to)


@contextlib.contextmanager
def writing_through(checkpoint_engine):
    """Within the block, ``atomic_torch_save`` hands its files to ``checkpoint_engine``."""
    token = _ACTIVE_WRITER.set(checkpoint_engine)
    try:
        yield checkpoint_engine
    finally:
        _ACTIVE_WRITER.reset(token)


def atomic_torch_save(obj, path, check=True):
    """``torch.save(obj, path)`` that is all-or-nothing; ``check`` first verifies that ``obj``
    loads back with ``weights_only=True`` (cheap: tensors are not serialised for the check).
    Inside ``save_checkpoint`` the file goes through the configured checkpoint engine instead
    (safetensors format, or a background write), with the same all-or-nothing guarantee."""
    writer = _ACTIVE_WRITER.get()
    if writer is not None:
        writer.save(obj, path, check=check)
        return
    write_torch_file(obj, path, check=check)


def write_torch_file(obj, path, check=True):
    """The synchronous torch.save writer behind ``atomic_torch_save``; never routed."""
    if check:
        ensure_weights_only_loadable(obj, what=os.fspath(path))
    _write_atomically(path, lambda f: torch.save(obj, f))


def write_file_atomically(path, write):
    """Write ``path`` all-or-nothing with ``write(binary_file)``; for other file formats."""
    _write_atomically(path, write)


def write_path_atomically(path, write_to):
    """Write ``path`` all-or-nothing with ``write_to(temporary_path)`` (the one implementation
    behind every writer here; also for writers that only take a file name, such as the
    ``safetensors`` library): the temporary is fsynced, renamed, and the rename fsynced."""
    path = os.fspath(path)
    tmp = temporary_name(path)
    try:
        write_to(tmp)
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        # leave no half-written temporary behind; the final name was never touched
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    _fsync_directory(os.path.dirname(path))


def atomic_write_text(path, text):
    """Write ``text`` (UTF-8) to ``path`` all-or-nothing; used for the ``latest`` tag file."""
    data = text.encode("utf-8")
    _write_atomically(path, lambda f: f.write(data))


# ------------------------------------------------------------------ weights-only checking
def _skeleton(obj):
    """``obj`` with every tensor replaced by an empty one of the same dtype: the pickle-level
    structure (what weights_only judges) without the cost of serialising the data."""
    if isinstance(obj, torch.Tensor):
        return torch.empty(0, dtype=obj.dtype)
    if isinstance(obj, Mapping):
        items = [(k, _skeleton(v)) for k, v in obj.items()]
        if type(obj) is dict:
            return dict(items)
        try:
            rebuilt = type(obj)()
        except TypeError:  # a mapping type that needs constructor arguments: check it as is
            return obj
        rebuilt.update(items)
        return rebuilt
    if isinstance(obj, list) and type(obj) is list:
        return [_skeleton(v) for v in obj]
    if isinstance(obj, tuple) and type(obj) is tuple:
        return tuple(_skeleton(v) for v in obj)
    return obj


def _weights_only_error(obj):
    """None when ``obj`` round-trips through weights-only loading, else torch's reason."""
    buffer = io.BytesIO()
    try:
        torch.save(_skeleton(obj), buffer)
    except (pickle.PicklingError, TypeError, AttributeError) as exc:
        return f"it cannot be pickled at all ({type(exc).__name__}: {exc})"
    buffer.seek(0)
    try:
        torch.load(buffer, weights_only=True)
    except pickle.UnpicklingError as exc:
        return _short_reason(exc)
    return None


def _short_reason(exc):
    for line in str(exc).splitlines():
        if "WeightsUnpickler error" in line:
            return line.strip()
    return str(exc).strip().splitlines()[-1] if str(exc).strip() else type(exc).__name__


def _find_culprit(obj, path, depth=3):
    """The deepest key path (up to ``depth`` levels) whose value alone fails the check."""
    if depth > 0 and isinstance(obj, (Mapping, list, tuple)):
        children = obj.items() if isinstance(obj, Mapping) else enumerate(obj)
        for key, value in children:
            if _weights_only_error(value) is not None:
                return _find_culprit(value, f"{path}[{key!r}]", depth - 1)
    return path, type(obj)


def ensure_weights_only_loadable(obj, what="checkpoint", root="state"):
    """Raise ``CheckpointFormatError`` naming the offending entry (as a key path under
    ``root``) when ``obj`` would need a full (code-executing) unpickler to be loaded again."""
    reason = _weights_only_error(obj)
    if reason is None:
        return
    where, kind = _find_culprit(obj, root)
    raise CheckpointFormatError(
        f"cannot write {what}: {where} (of type {kind.__module__}.{kind.__qualname__}) would "
        f"not load with torch.load(weights_only=True): {reason.rstrip('.')}. Store only "
        f"tensors, numbers, strings, None and lists/tuples/dicts of those (e.g. vars(args) "
        f"instead of an argparse Namespace, array.tolist() instead of a numpy array)")


def load_file(path):
    """``torch.load`` a checkpoint file on CPU with ``weights_only=True`` (never runs code from
    the file); a file that needs more is reported with its path and the refused object. A file
    the safetensors checkpoint engine wrote (same name, other format) is recognised by its
    first bytes and read by that engine, so readers never need to know the configured engine."""
    from deepspeed.checkpoint.engines import safetensors_format

    with open(os.fspath(path), "rb") as f:
        head = f.read(9)
    if safetensors_format.is_safetensors(head):
        return safetensors_format.read(os.fspath(path))
    try:
        return torch.load(os.fspath(path), map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        raise CheckpointFormatError(
            f"'{path}' cannot be loaded with torch.load(weights_only=True): {_short_reason(exc)}. "
            f"DeepSpeed checkpoints only hold tensors and plain Python values; this file was "
            f"written by other code or holds pickled objects") from exc
