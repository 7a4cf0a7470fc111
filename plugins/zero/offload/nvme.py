"""ZeRO-Offload to NVMe: optimizer state (and the fp32 master params) live on disk between steps.

The ZeRO optimizer calls `swap_out(p)` after stepping p and `swap_in(p)` (optionally preceded by
`prefetch(p)`) before the next step touches it, so only the params being stepped occupy host memory.
All I/O goes through one `deepspeed.ops.aio.aio_handle` per swapper: the native DeepNVMe op when it
builds, else its thread-pool fallback (both expose the same calls).

Alignment: neither engine requires page-aligned buffers or sizes that are multiples of the block size
(csrc/aio/aio_io.h: aligned chunks go through O_DIRECT, the rest through a buffered descriptor), so
files hold the tensor bytes exactly, with no padding to strip on read.

Ordering: the native engine runs queued requests concurrently, so a read of a file must never be
queued while a write of that same file is still in flight; swap_in/prefetch drain outstanding writes
of a param before reading it back.

Pipelining (``offload_optimizer.pipeline_read`` / ``pipeline_write``): with ``read_ahead`` the
optimizer prefetches the next sub-group right after swapping this one in, so its read runs
while this one steps; with ``write_behind`` writes go through a handle of their own and
``swap_in`` waits only for reads, so a sub-group's write runs while the next one steps. Without
them a swap-in reads synchronously and a swap-out returns only when the bytes are written.
"""
from __future__ import annotations

import itertools
import os
import re
import secrets
import tempfile
from dataclasses import dataclass, field

import torch

_DEFAULT_KEY = "zero_optimization.offload_optimizer.nvme_path"
_SWAPPER_IDS = itertools.count()
_DATA = object()  # the record key of param.data (state keys may be any hashable, so not a string)


def validate_nvme_path(nvme_path, key=_DEFAULT_KEY) -> str:
    """Fail at configuration time, not at the first swap mid-training, on a path that cannot hold swap files."""
    if nvme_path is None or str(nvme_path).strip() == "":
        raise ValueError(f"{key} must name an existing writable directory, got {nvme_path!r}")
    path = os.path.abspath(os.path.expanduser(os.fspath(nvme_path)))
    if not os.path.exists(path):
        raise ValueError(f"{key}: directory {path!r} does not exist; create it or point {key} elsewhere")
    if not os.path.isdir(path):
        raise ValueError(f"{key}: {path!r} is not a directory; {key} must name a directory")
    try:
        fd, probe = tempfile.mkstemp(prefix=".ds_nvme_probe_", dir=path)
    except OSError as err:
        raise ValueError(f"{key}: directory {path!r} is not writable ({err.strerror})") from err
    os.close(fd)
    os.unlink(probe)
    return path


@dataclass
class _Tensor:
    """Where one swapped tensor lives and what it must look like when it comes back."""
    path: str
    shape: torch.Size
    dtype: torch.dtype
    device: torch.device
    nbytes: int


@dataclass
class _Record:
    param: torch.nn.Parameter
    index: int
    paths: dict = field(default_factory=dict)  # record key -> file path, reused across swaps
    tensors: dict = field(default_factory=dict)  # record key -> _Tensor, while swapped out
    swapped: bool = False
    writes_pending: bool = False
    reads: dict = None  # record key -> (cpu buffer being read into, target device) while prefetching


class OptimizerStateSwapper:
    """Moves a param's data and its optimizer state tensors to per-tensor files and back, bit-exactly."""

    def __init__(self, optimizer, nvme_path, rank, aio_kwargs=None, pin_memory=False,
                 buffer_count=4, folder="zero_stage_optimizer", handle=None, read_ahead=False,
                 write_behind=False, write_handle=None):
        """`handle`: an already built aio handle (e.g. `deepspeed.ops.aio.fallback.aio_handle()`),
        instead of one built from `aio_kwargs`; lets callers share a handle or force an engine.
        `read_ahead` / `write_behind`: see the module docstring (`write_handle`: the handle for
        writes behind, built like `handle` when not given)."""
        if not hasattr(optimizer, "state"):
            raise TypeError(f"OptimizerStateSwapper needs an optimizer with a .state mapping, "
                            f"got {type(optimizer).__name__}")
        if isinstance(rank, bool) or not isinstance(rank, int) or rank < 0:
            raise ValueError(f"OptimizerStateSwapper: rank must be an int >= 0, got {rank!r}")
        if isinstance(buffer_count, bool) or not isinstance(buffer_count, int) or buffer_count < 1:
            raise ValueError(f"OptimizerStateSwapper: buffer_count must be an int >= 1, got {buffer_count!r}")
        if not folder or os.sep in folder or folder in (".", ".."):
            raise ValueError(f"OptimizerStateSwapper: folder must be a plain directory name, got {folder!r}")
        if handle is not None and aio_kwargs:
            raise ValueError("OptimizerStateSwapper: pass either aio_kwargs or handle, not both")
        root = validate_nvme_path(nvme_path)
        self.optimizer = optimizer
        self.pin_memory = bool(pin_memory)
        self.buffer_count = buffer_count
        self._folder_dir = os.path.join(root, folder)
        self.swap_dir = os.path.join(self._folder_dir, f"rank{rank}")
        os.makedirs(self.swap_dir, exist_ok=True)
        # pid + process-wide counter + random: unique across swappers, processes and reruns on one path.
        self._uid = f"{os.getpid()}_{next(_SWAPPER_IDS)}_{secrets.token_hex(4)}"
        if handle is None:
            from deepspeed.ops import aio

            handle = aio.aio_handle(**(aio_kwargs or {}))
        self.handle = handle
        self.read_ahead = bool(read_ahead)
        self.write_behind = bool(write_behind)
        if write_behind and write_handle is None:
            from deepspeed.ops import aio

            write_handle = aio.aio_handle(**(aio_kwargs or {}))
        self.write_handle = write_handle if write_behind else handle
        self._records = {}  # id(param) -> _Record
        self._inflight = []  # tensors referenced by queued reads (and writes on the same handle)
        self._writes = []  # tensors referenced by writes queued on write_handle (write_behind)
        self._closed = False
        self.joins = 0  # times a caller waited for queued I/O (how serial the swapping was)

    # ---- public API -------------------------------------------------------------------------------

    def swap_out(self, param, wait=True):
        """Write ``param``'s data and optimizer state to their files and free them. Without
        ``write_behind`` it returns once the bytes are written, unless ``wait`` is False (then
        the writes join the queue, at most ``buffer_count`` in flight, until ``wait()``)."""
        self._check_open()
        rec = self._record(param)
        if rec.swapped:
            return
        state = self.optimizer.state.get(param)
        targets = [(_DATA, param.data)]
        if state:
            targets += [(k, v) for k, v in state.items() if torch.is_tensor(v)]
        for key, tensor in targets:
            path = rec.paths.get(key) or self._new_path(rec, key)
            rec.paths[key] = path
            meta = _Tensor(path, tensor.shape, tensor.dtype, tensor.device, tensor.numel() * tensor.element_size())
            self._write(tensor, path, meta.nbytes)
            rec.tensors[key] = meta
            empty = torch.empty(0, dtype=tensor.dtype, device=tensor.device)
            if key is _DATA:
                param.data = empty
            else:
                state[key] = empty
        rec.swapped = True
        rec.writes_pending = True
        if wait and not self.write_behind:
            self.wait()  # the bytes are on disk before the caller goes on

    def swap_out_all(self, params, wait_each=True):
        """``swap_out`` each of ``params``, and return once every write is done. Without
        ``wait_each`` (``offload_optimizer.fast_init``, the optimizer's first swap-out) the
        writes are queued together, ``buffer_count`` in flight, and joined as the queue
        fills, instead of one write at a time."""
        for param in params:
            self.swap_out(param, wait=wait_each)
        self.wait()

    def prefetch(self, param):
        self._check_open()
        rec = self._records.get(id(param))
        if rec is None or not rec.swapped or rec.reads is not None:
            return
        if rec.writes_pending:
            self.wait()
        rec.reads = {}
        for key, meta in rec.tensors.items():
            buf = self._host_buffer(meta)
            if meta.nbytes:
                self._throttle()
                self.handle.async_pread(buf, meta.path)
                self._inflight.append(buf)
            rec.reads[key] = buf

    def swap_in(self, param):
        self._check_open()
        rec = self._records.get(id(param))
        if rec is None or not rec.swapped:
            return
        self.prefetch(param)
        if self._inflight:
            self._wait_reads()  # writes behind (other params' files) keep running
        state = None
        for key, buf in rec.reads.items():
            meta = rec.tensors[key]
            value = buf.view(meta.shape)
            if value.device != meta.device:
                value = value.to(meta.device, non_blocking=self.pin_memory)
            if key is _DATA:
                param.data = value
            else:
                if state is None:
                    state = self.optimizer.state[param]
                state[key] = value
        rec.reads = None
        rec.tensors = {}
        rec.swapped = False

    def is_swapped(self, param) -> bool:
        rec = self._records.get(id(param))
        return rec is not None and rec.swapped

    def swapped_bytes(self) -> int:
        return sum(m.nbytes for rec in self._records.values() if rec.swapped for m in rec.tensors.values())

    def reads_in_flight(self) -> int:
        """Tensors whose read (a prefetch) is queued or running."""
        return len(self._inflight) if self.write_behind else sum(
            1 for rec in self._records.values() if rec.reads is not None and rec.swapped)

    def writes_in_flight(self) -> int:
        """Tensors whose write may still be running (without write_behind a swap-out returns
        only when its writes are done, so none)."""
        return len(self._writes)

    def wait(self):
        """Joins all queued I/O; the tensors it referenced are released afterwards, error or not."""
        try:
            self._wait_reads()
        finally:
            try:
                if self._writes:
                    self.joins += 1
                    self.write_handle.wait()
            finally:
                self._writes = []
                for rec in self._records.values():
                    rec.writes_pending = False

    def _wait_reads(self):
        """Joins the I/O queued on the read handle (every write too, unless writes go behind)."""
        try:
            if self._inflight:
                self.joins += 1
                self.handle.wait()
        finally:
            self._inflight = []
            if not self.write_behind:
                for rec in self._records.values():
                    rec.writes_pending = False

    def close(self):
        """Leaves other swappers' files (same rank, same path) alone: only empty folders are removed."""
        if self._closed:
            return
        self.wait()
        self._closed = True
        for rec in self._records.values():
            for path in rec.paths.values():
                if os.path.exists(path):
                    os.unlink(path)
        self._records = {}
        for d in (self.swap_dir, self._folder_dir):
            try:
                os.rmdir(d)
            except FileNotFoundError:
                continue
            except OSError:  # not empty: another swapper or rank still has files there
                break

    # ---- internals --------------------------------------------------------------------------------

    def _check_open(self):
        if self._closed:
            raise RuntimeError(f"OptimizerStateSwapper for {self.swap_dir!r} is closed")

    def _record(self, param):
        rec = self._records.get(id(param))
        if rec is None:
            rec = _Record(param=param, index=len(self._records))
            self._records[id(param)] = rec
        return rec

    def _new_path(self, rec, key):
        if key is _DATA:
            name = "data"
        else:
            # The position keeps two keys that sanitize alike apart.
            safe = re.sub(r"[^A-Za-z0-9_.-]", "_", str(key))[:40]
            name = f"s{len(rec.paths)}_{safe}"
        return os.path.join(self.swap_dir, f"{self._uid}_p{rec.index}_{name}.swp")

    def _throttle(self, writing=False):
        """Bounds how many tensors (and staging copies) queued I/O keeps alive at once."""
        if writing and self.write_behind:
            if len(self._writes) >= self.buffer_count:
                self.write_handle.wait()
                self._writes = []
        elif len(self._inflight) >= self.buffer_count:
            self.wait()

    def _host_buffer(self, meta):
        # Flat: the fallback engine cannot byte-view a 0-dim tensor; swap_in restores the shape.
        buf = torch.empty(meta.shape.numel(), dtype=meta.dtype, device="cpu")
        if self.pin_memory:
            from deepspeed.accelerator import get_accelerator

            buf = get_accelerator().pin_memory(buf)
        return buf

    def _write(self, tensor, path, nbytes):
        if os.path.exists(path) and os.path.getsize(path) > nbytes:
            os.truncate(path, nbytes)  # a smaller rewrite must not leave stale bytes counted on disk
        src = tensor.detach()
        if src.device.type != "cpu":
            host = self._host_buffer(_Tensor(path, src.shape, src.dtype, src.device, nbytes))
            host.copy_(src.reshape(-1))  # blocking: the bytes must be on the host before the write is queued
            src = host
        elif not src.is_contiguous():
            src = src.contiguous()
        self._throttle(writing=True)
        self.write_handle.async_pwrite(src.reshape(-1), path)
        (self._writes if self.write_behind else self._inflight).append(src)
