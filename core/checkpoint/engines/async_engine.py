"""Asynchronous checkpointing: ``save_checkpoint`` returns once the state is copied to host
memory; a background thread writes the files while training continues.

Crash safety rests on two rules. Each file is written by a synchronous engine (temporary name,
fsync, atomic rename), so no file is ever torn. And ``latest`` moves to a tag only in
``commit``, after this rank's writer finished and every rank agreed that its files are durable,
so a process killed mid-write (even SIGKILL) leaves ``latest`` naming the previous, complete
tag. The next ``save_checkpoint``, a ``load_checkpoint`` and ``engine.checkpoint_engine.wait()``
commit the pending tag; at most one tag is in flight, which bounds the host memory to one
snapshot.
"""
import atexit
import os
import threading
import weakref

from deepspeed.checkpoint.atomic import ensure_weights_only_loadable
from deepspeed.checkpoint.engines.base import CheckpointEngine
from deepspeed.checkpoint.engines.snapshot import host_snapshot
from deepspeed.utils.logging import logger

_LIVE = weakref.WeakSet()


class AsyncCheckpointEngine(CheckpointEngine):
    """Snapshots in ``save``, writes through ``writer`` (a synchronous engine) on a thread."""

    name = "async"
    is_async = True

    def __init__(self, writer):
        super().__init__()
        self.writer = writer
        self._staged = None      # [(snapshot, path)] of the tag being saved
        self._thread = None
        self._write_error = None
        # set by the writer thread when the files of the pending tag are all written (or it
        # failed); tests and callers can observe progress without timing anything
        self.write_finished = threading.Event()
        _LIVE.add(self)

    @property
    def in_flight(self):
        """Whether the background writer is still writing."""
        return self._thread is not None and self._thread.is_alive()

    def begin(self, tag):
        super().begin(tag)
        self._staged = []

    def save(self, state, path, check=True):
        if self._staged is None:  # outside a checkpoint save: nothing to overlap with
            self.writer.save(state, path, check=check)
            return
        if check:  # refused at save time, on the calling rank, as the synchronous engines do
            ensure_weights_only_loadable(state, what=os.fspath(path))
        self._staged.append((host_snapshot(state), os.fspath(path)))

    def end(self, tag, on_commit):
        super().end(tag, on_commit)
        files, self._staged = self._staged or [], None
        self._write_error = None
        self.write_finished = threading.Event()
        # not a daemon: an exiting interpreter finishes the files (``latest`` stays put)
        self._thread = threading.Thread(target=self._write_all, args=(files, self.write_finished),
                                        name=f"deepspeed-checkpoint-writer[{tag}]")
        self._thread.start()

    def _write_all(self, files, finished):
        try:
            while files:
                snapshot, path = files.pop(0)  # drop each snapshot as soon as it is on disk
                self.writer.save(snapshot, path, check=False)
        except BaseException as exc:  # reported by commit(), on the main thread, to all ranks
            self._write_error = exc
        finally:
            finished.set()

    def abort(self, tag):
        self._staged = None
        super().abort(tag)

    def commit(self, tag):
        pending_tag, on_commit = self._take(tag)
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        error, self._write_error = self._write_error, None
        on_commit(error)
        return pending_tag


@atexit.register
def _warn_uncommitted():
    for engine in list(_LIVE):
        if engine.pending_tag is not None:
            logger.warning(f"asynchronous checkpoint '{engine.pending_tag}' was written but never "
                           f"committed ('latest' still names the previous checkpoint); call "
                           f"engine.checkpoint_engine.wait() after the last save_checkpoint")
