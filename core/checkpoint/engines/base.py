"""The checkpoint engine interface and the two synchronous engines.

A checkpoint engine decides *how* the files of one checkpoint tag reach storage; *which* files
and *when* ``latest`` may name the tag is ``deepspeed.checkpoint.save``'s business. The
protocol of one save, on every rank:

    engine.begin(tag)                    # files of ``tag`` follow
    engine.save(state, path)             # once per file (core files and plugins' files)
    engine.end(tag, on_commit)           # no more files; ``on_commit`` moves ``latest``
    engine.commit(tag)                   # collective: files durable everywhere, then on_commit

Synchronous engines have written and fsynced each file inside ``save``; the asynchronous one
only snapshots there and writes in the background, so its ``commit`` first waits for the
writer. ``wait()`` commits whatever is still pending (the next save, a load and ``destroy``
call it).
"""
import os

from deepspeed.checkpoint.atomic import (ensure_weights_only_loadable, load_file,
                                         write_path_atomically, write_torch_file)
from deepspeed.checkpoint.engines import safetensors_format


class CheckpointEngine:
    """Synchronous base: ``save`` writes at once; ``commit`` only runs the commit callback."""

    name = "base"
    is_async = False

    def __init__(self):
        self._uncommitted = None  # (tag, on_commit) between end() and commit()

    # ---------------------------------------------------------------- one file
    def save(self, state, path, check=True):
        """Write ``state`` to ``path`` all-or-nothing (or, asynchronously, schedule it)."""
        raise NotImplementedError

    def load(self, path):
        """Read a file any engine wrote (the format is recognised from the file)."""
        return load_file(path)

    # ---------------------------------------------------------------- one tag
    def begin(self, tag):
        if self._uncommitted is not None:
            raise RuntimeError(f"checkpoint '{self._uncommitted[0]}' is not committed yet; "
                               f"call commit()/wait() before saving '{tag}'")

    def end(self, tag, on_commit):
        """All files of ``tag`` were handed over. ``on_commit(write_error)`` is collective: it
        receives this rank's write error (None when the files are durable) and moves
        ``latest`` once every rank succeeded."""
        self._uncommitted = (tag, on_commit)

    def abort(self, tag):
        """The save of ``tag`` failed before ``end``: forget it (its files are not named by
        ``latest``, so a half-written tag never matters)."""
        self._uncommitted = None

    def commit(self, tag):
        """Collective: make ``tag`` durable on every rank, then let ``latest`` name it."""
        pending_tag, on_commit = self._take(tag)
        on_commit(None)
        return pending_tag

    def wait(self):
        """Commit the pending tag, if any (collective). Returns the committed tag or None."""
        if self._uncommitted is None:
            return None
        return self.commit(self._uncommitted[0])

    @property
    def pending_tag(self):
        return self._uncommitted[0] if self._uncommitted is not None else None

    def _take(self, tag):
        if self._uncommitted is None or self._uncommitted[0] != tag:
            raise ValueError(f"cannot commit checkpoint '{tag}': the pending checkpoint is "
                             f"{self.pending_tag!r}")
        pending, self._uncommitted = self._uncommitted, None
        return pending

    def __repr__(self):
        return f"{type(self).__name__}(pending={self.pending_tag!r})"


class TorchCheckpointEngine(CheckpointEngine):
    """``torch.save`` files, written atomically (temporary name, fsync, rename)."""

    name = "torch"

    def save(self, state, path, check=True):
        write_torch_file(state, path, check=check)


class SafetensorsCheckpointEngine(CheckpointEngine):
    """Tensors in a safetensors file under the usual file name, the rest of the state as JSON
    beside it (``<name>.state.json``, see ``safetensors_format``); ``load`` returns exactly the
    dict that was saved, and never unpickles anything."""

    name = "safetensors"

    def save(self, state, path, check=True):
        if check:
            ensure_weights_only_loadable(state, what=os.fspath(path))
        safetensors_format.write(state, path, write_path_atomically)
