"""One read or write benchmark with the DeepNVMe handle: what ``ds_io`` runs and what
``ds_nvme_tune`` repeats for each configuration of its sweep.

Each worker (one per folder times ``threads``) owns a handle and one file of ``io_size`` bytes
and moves it ``loops`` times between a tensor and the file. Two times are kept per loop, the
slowest worker's: *task* (the handle's read/write until it completes) and *end to end* (also the
buffer's allocation, pinned or on the device, and the copy a device tensor needs). Speeds are
total bytes over time in GB/sec (10^9 bytes).
"""
from __future__ import annotations

import os
import re
import threading
import time
from dataclasses import asdict, dataclass

import torch

_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
FILE_PREFIX = "_ds_io_"


def parse_size(text, what="size"):
    """Bytes of '4M', '128K', '1G', '4096' (binary units, an optional trailing 'B')."""
    match = re.fullmatch(r"\s*(\d+)\s*([KMGT]?)B?\s*", str(text), re.IGNORECASE)
    if match is None or int(match.group(1)) <= 0:
        raise ValueError(f"{what} {text!r} is not a positive size like 4096, 128K, 4M or 1G")
    return int(match.group(1)) * _UNITS[match.group(2).upper()]


@dataclass(frozen=True)
class HandleConfig:
    """The handle parameters a sweep varies; ``asdict`` is the config's ``aio`` section."""

    block_size: int = 1 << 20
    queue_depth: int = 32
    intra_op_parallelism: int = 1
    single_submit: bool = False
    overlap_events: bool = True

    def aio_section(self):
        return {"aio": asdict(self)}


def make_handle(config: HandleConfig, use_gds=False):
    """An aio handle, or a GPUDirect one (which raises here with why when GDS is missing)."""
    if use_gds:
        from deepspeed.ops.gds import gds_handle as factory
    else:
        from deepspeed.ops.aio import aio_handle as factory
    return factory(**asdict(config))


@dataclass
class IoResult:
    op: str  # "read" or "write"
    total_bytes: int
    task_seconds: float  # mean over loops of the slowest worker's task time
    e2e_seconds: float

    @property
    def task_gbs(self):
        return self.total_bytes / self.task_seconds / 1e9

    @property
    def e2e_gbs(self):
        return self.total_bytes / self.e2e_seconds / 1e9

    def lines(self):
        name = self.op.capitalize()
        return [f"Task {name} Latency = {self.task_seconds:.6f} sec",
                f"Task {name} Speed = {self.task_gbs:.3f} GB/sec",
                f"E2E {name} Latency = {self.e2e_seconds:.6f} sec",
                f"E2E {name} Speed = {self.e2e_gbs:.3f} GB/sec"]


def _pattern(nbytes, seed):
    return torch.randint(0, 256, (nbytes,), dtype=torch.uint8,
                         generator=torch.Generator().manual_seed(seed))


PIN_MODES = ("handle", "accelerator", "none")


def _buffer(handle, nbytes, device, pin):
    """The transfer's tensor: on the device, or host memory pinned by the handle
    (``new_cpu_locked_tensor``) or by the accelerator (``pin_memory``), or plain."""
    if device != "cpu":
        return torch.empty(nbytes, dtype=torch.uint8, device=device)
    if pin == "handle":
        return handle.new_cpu_locked_tensor(nbytes, torch.empty(0, dtype=torch.uint8))
    if pin == "accelerator":
        from deepspeed.accelerator import get_accelerator

        return get_accelerator().pin_memory(torch.empty(nbytes, dtype=torch.uint8))
    return torch.empty(nbytes, dtype=torch.uint8)


def _release(handle, buffer, device, pin):
    if device == "cpu" and pin == "handle":
        handle.free_cpu_locked_tensor(buffer)


class _Worker:
    """One handle and one file; ``run_once`` moves the file once and returns (task, e2e) s."""

    def __init__(self, folder, index, op, nbytes, config, device, pin, use_gds, validate):
        os.makedirs(folder, exist_ok=True)
        self.path = os.path.join(folder, f"{FILE_PREFIX}{os.getpid()}_{index}.bin")
        self.op, self.nbytes, self.device, self.pin = op, nbytes, device, pin
        self.validate = validate
        self.handle = make_handle(config, use_gds)
        self.data = _pattern(nbytes, index)
        if op == "read":  # the file to read, written untimed
            with open(self.path, "wb") as f:
                f.write(self.data.numpy().tobytes())

    def run_once(self):
        start = time.perf_counter()
        buffer = _buffer(self.handle, self.nbytes, self.device, self.pin)
        if self.op == "write":
            buffer.copy_(self.data)
        task_start = time.perf_counter()
        if self.op == "read":
            self.handle.sync_pread(buffer, self.path)
        else:
            self.handle.sync_pwrite(buffer, self.path)
        task = time.perf_counter() - task_start
        if self.op == "read" and self.device != "cpu":
            buffer = buffer.to("cpu")
        e2e = time.perf_counter() - start
        if self.validate:
            self._check(buffer)
        _release(self.handle, buffer, self.device, self.pin)
        return task, e2e

    def _check(self, buffer):
        if self.op == "read":
            got = buffer.to("cpu")
        else:
            with open(self.path, "rb") as f:
                got = torch.frombuffer(bytearray(f.read()), dtype=torch.uint8)
        if not torch.equal(got, self.data):
            raise RuntimeError(f"ds_io: validation failed: {self.op} of '{self.path}' "
                               f"({self.nbytes} bytes) did not round-trip")

    def remove(self):
        try:
            os.remove(self.path)
        except FileNotFoundError:
            pass


def run_io(folders, io_size, op, config=HandleConfig(), loops=1, threads=1, device="cpu",
           pin="handle", use_gds=False, validate=False):
    """Benchmark ``op`` ('read' or 'write') of ``io_size`` bytes per worker; an ``IoResult``."""
    if op not in ("read", "write"):
        raise ValueError(f"op must be 'read' or 'write', got {op!r}")
    if pin not in PIN_MODES:
        raise ValueError(f"pin must be one of {PIN_MODES}, got {pin!r}")
    if loops < 1 or threads < 1:
        raise ValueError(f"loops and threads must be >= 1, got {loops} and {threads}")
    workers = [_Worker(folder, i * len(folders) + j, op, io_size, config, device, pin, use_gds,
                       validate)
               for i in range(threads) for j, folder in enumerate(folders)]
    try:
        task_total = e2e_total = 0.0
        for _ in range(loops):
            times = _together(workers)
            task_total += max(t for t, _ in times)
            e2e_total += max(e for _, e in times)
    finally:
        for worker in workers:
            worker.remove()
    return IoResult(op, io_size * len(workers), task_total / loops, e2e_total / loops)


def _together(workers):
    """Each worker's ``run_once`` in its own thread, started together; the first error raises."""
    if len(workers) == 1:
        return [workers[0].run_once()]
    results, errors = [None] * len(workers), []
    gate = threading.Barrier(len(workers))

    def body(i):
        try:
            gate.wait()
            results[i] = workers[i].run_once()
        except BaseException as err:  # re-raised below in the caller's thread
            errors.append(err)

    threads = [threading.Thread(target=body, args=(i,)) for i in range(len(workers))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return results
