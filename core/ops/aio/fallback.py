"""Pure-Python `aio_handle`, used when the async_io extension cannot be built.

Same API and errors as the native handle: a request is split into intra_op_parallelism slices of
whole blocks, each moved by a pool thread with os.pread/os.pwrite (which release the GIL, so the
slices really overlap). queue_depth, single_submit and overlap_events are kept for the getters;
a blocking pread has nothing to queue. Buffered I/O only: O_DIRECT needs aligned memory that a
Python buffer cannot promise.
"""
from __future__ import annotations

import os
import weakref
from concurrent.futures import ThreadPoolExecutor

import torch

ALIGNMENT = 4096


def backend():
    return "python-threads"


def _positive(name, value):
    if int(value) <= 0:
        raise ValueError(f"aio_handle: {name} must be > 0, got {value!r}")
    return int(value)


def _check_readable(filename, offset, nbytes):
    try:
        size = os.stat(filename).st_size
    except OSError as err:
        raise ValueError(f"async_io: cannot read '{filename}': {err.strerror}") from err
    if size < offset + nbytes:
        raise ValueError(f"async_io: file '{filename}' holds {size} bytes, but reading {nbytes} bytes "
                         f"at file offset {offset} needs {offset + nbytes}")


def _move(is_read, filename, view, file_offset, block_size):
    """One slice: loops over blocks, finishing short transfers."""
    flags = os.O_RDONLY if is_read else os.O_WRONLY | os.O_CREAT
    verb = "read from" if is_read else "write to"
    try:
        fd = os.open(filename, flags, 0o644)
    except OSError as err:
        raise RuntimeError(f"async_io: {verb} '{filename}' failed at file offset {file_offset} "
                           f"({len(view)} bytes): {err.strerror}") from err
    try:
        pos = 0
        while pos < len(view):
            chunk = view[pos:pos + block_size]
            off = file_offset + pos
            try:
                n = os.preadv(fd, [chunk], off) if is_read else os.pwrite(fd, chunk, off)
            except OSError as err:
                raise RuntimeError(f"async_io: {verb} '{filename}' failed at file offset {off} "
                                   f"({len(chunk)} bytes): {err.strerror}") from err
            if n == 0:
                raise RuntimeError(f"async_io: read from '{filename}' failed at file offset {off}: "
                                   "unexpected end of file")
            pos += n
    finally:
        os.close(fd)


class _Op:
    def __init__(self, user, host, is_read, filename, file_offset, validate, futures):
        self.user, self.host, self.is_read = user, host, is_read
        self.filename, self.file_offset, self.validate = filename, file_offset, validate
        self.futures = futures

    def finish(self):
        errors = [f.exception() for f in self.futures]
        first = next((e for e in errors if e is not None), None)
        if first is not None:
            raise first
        if self.validate:
            self._compare()
        if self.is_read and self.user is not self.host:
            self.user.copy_(self.host)

    def _compare(self):
        nbytes = self.host.numel() * self.host.element_size()
        with open(self.filename, "rb") as f:
            f.seek(self.file_offset)
            back = f.read(nbytes)
        if back != _bytes_view(self.host).tobytes():
            raise RuntimeError(f"async_io: validation failed: the {nbytes} bytes at file offset "
                               f"{self.file_offset} of '{self.filename}' differ from the tensor")


def _bytes_view(t):
    # reshape(-1): a 0-dim tensor (a scalar optimizer state) has no byte view of its own
    return memoryview(t.reshape(-1).view(torch.uint8).numpy()) if t.numel() else memoryview(b"")


class aio_handle:
    """Tensor <-> file I/O split across intra_op_parallelism threads (Python fallback)."""

    def __init__(self, block_size=1048576, queue_depth=128, single_submit=False, overlap_events=False,
                 intra_op_parallelism=1):
        self._block_size = _positive("block_size", block_size)
        self._queue_depth = _positive("queue_depth", queue_depth)
        self._threads = _positive("intra_op_parallelism", intra_op_parallelism)
        self._single_submit, self._overlap_events = bool(single_submit), bool(overlap_events)
        self._pool = ThreadPoolExecutor(self._threads, thread_name_prefix="ds_aio")
        self._pending = []
        self._locked = weakref.WeakValueDictionary()  # data_ptr -> live tensor; dead ones drop out

    def get_block_size(self):
        return self._block_size

    def get_queue_depth(self):
        return self._queue_depth

    def get_single_submit(self):
        return self._single_submit

    def get_overlap_events(self):
        return self._overlap_events

    def get_intra_op_parallelism(self):
        return self._threads

    def get_alignment(self):
        return ALIGNMENT

    def _submit(self, buffer, filename, is_read, validate, async_op, file_offset):
        filename = os.fspath(filename)
        if file_offset < 0:
            raise ValueError(f"async_io: file_offset must be >= 0, got {file_offset}")
        direct = buffer.device.type == "cpu" and buffer.is_contiguous()
        if direct:
            host = buffer
        elif is_read:
            host = torch.empty(buffer.shape, dtype=buffer.dtype)
        else:
            host = buffer.detach().to("cpu").contiguous()
        nbytes = host.numel() * host.element_size()
        if is_read:
            _check_readable(filename, file_offset, nbytes)
        view = _bytes_view(host.detach())
        per = -(-nbytes // self._threads)
        per = max(self._block_size, -(-per // self._block_size) * self._block_size)
        futures = [self._pool.submit(_move, is_read, filename, view[pos:pos + per], file_offset + pos,
                                     self._block_size) for pos in range(0, max(nbytes, 1), per)]
        op = _Op(buffer, host, is_read, filename, file_offset, validate, futures)
        if async_op:
            self._pending.append(op)
            return 0
        op.finish()
        return 1

    def sync_pread(self, buffer, filename, file_offset=0):
        return self._submit(buffer, filename, True, False, False, file_offset)

    def sync_pwrite(self, buffer, filename, file_offset=0):
        return self._submit(buffer, filename, False, False, False, file_offset)

    def async_pread(self, buffer, filename, file_offset=0):
        return self._submit(buffer, filename, True, False, True, file_offset)

    def async_pwrite(self, buffer, filename, file_offset=0):
        return self._submit(buffer, filename, False, False, True, file_offset)

    def pread(self, buffer, filename, validate=False, async_op=False, file_offset=0):
        return self._submit(buffer, filename, True, validate, async_op, file_offset)

    def pwrite(self, buffer, filename, validate=False, async_op=False, file_offset=0):
        return self._submit(buffer, filename, False, validate, async_op, file_offset)

    def read(self, buffer, filename, validate=False, file_offset=0):
        return self._submit(buffer, filename, True, validate, False, file_offset)

    def write(self, buffer, filename, validate=False, file_offset=0):
        return self._submit(buffer, filename, False, validate, False, file_offset)

    def wait(self):
        """Joins every queued op; returns how many completed, raising the first error after all."""
        ops, self._pending = self._pending, []
        first = None
        for op in ops:
            try:
                op.finish()
            except (RuntimeError, OSError, ValueError) as err:
                first = first or err
        if first is not None:
            raise first
        return len(ops)

    def new_cpu_locked_tensor(self, num_elem, example_tensor):
        if num_elem < 0:
            raise ValueError(f"new_cpu_locked_tensor: num_elem must be >= 0, got {num_elem}")
        t = torch.empty(int(num_elem), dtype=example_tensor.dtype)
        if torch.cuda.is_available():
            t = t.pin_memory()  # a CPU-only torch cannot pin; the plain tensor works the same
        self._locked[t.data_ptr()] = t
        return t

    def free_cpu_locked_tensor(self, tensor):
        return self._locked.pop(tensor.data_ptr(), None) is not None

    def is_pinned(self, tensor):
        return tensor.data_ptr() in self._locked
