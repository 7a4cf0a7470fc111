"""Measure the tensor memory of a training step, split into "device" and "host pool" bytes.

Long-context features trade device memory for host memory (FPDT chunk offload, activation
offload). On a GPU the two are different memories; on a CPU-only machine both are RAM, so a
process RSS cannot tell them apart. :class:`TrackedTensorMemory` counts every tensor storage
created while it is active (a ``TorchDispatchMode``: it sees every aten op, forward and backward,
including the receive buffers of collectives) and files it under "host" when it was allocated
inside :func:`host_pool` (the offloaders allocate their host copies there) and under "device"
otherwise. A storage stops counting when it is freed (weak reference). With ``budget`` set, the
step is stopped with :class:`MemoryBudgetExceeded` the moment live device bytes pass it, so a
configuration that does not fit is measured up to the point where it stops fitting, without
allocating the rest.

Tensors that existed before the mode was entered (parameters, optimizer state) are not counted;
add them yourself if the budget should include them.
"""
import contextlib

import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

_host_depth = [0]


@contextlib.contextmanager
def host_pool():
    """Storages allocated inside are host-pool bytes (offloaded copies), not device bytes."""
    _host_depth[0] += 1
    try:
        yield
    finally:
        _host_depth[0] -= 1


def in_host_pool():
    return _host_depth[0] > 0


class MemoryBudgetExceeded(RuntimeError):
    """Live device tensor bytes passed the budget; ``peak`` holds the bytes at that moment."""

    def __init__(self, peak, budget):
        super().__init__(f"tracked device tensor memory {peak / 2**20:.1f} MiB exceeds the budget "
                         f"of {budget / 2**20:.1f} MiB")
        self.peak, self.budget = peak, budget


class TrackedTensorMemory(TorchDispatchMode):
    """``with TrackedTensorMemory(budget=None) as mem: ...``; then ``mem.peak_device``,
    ``mem.peak_host`` (bytes) and ``mem.exceeded``."""

    def __init__(self, budget=None):
        super().__init__()
        self.budget = budget
        self.live = {}  # storage id -> (weak ref, bytes, is_host)
        self.device = self.host = 0  # live bytes, possibly counting freed storages until swept
        self.peak_device = self.peak_host = 0
        self.exceeded = False

    def _sweep(self):
        for key in [k for k, (ref, _, _) in self.live.items() if ref.expired()]:
            _, nbytes, is_host = self.live.pop(key)
            if is_host:
                self.host -= nbytes
            else:
                self.device -= nbytes

    def _track(self, out):
        for t in tree_flatten(out)[0]:
            if not isinstance(t, torch.Tensor) or t.device.type == "meta":
                continue
            storage = t.untyped_storage()
            key = storage._cdata
            if key in self.live and not self.live[key][0].expired():
                continue
            if key in self.live:  # a freed storage's address was reused
                _, nbytes, is_host = self.live.pop(key)
                self.host, self.device = ((self.host - nbytes, self.device) if is_host
                                          else (self.host, self.device - nbytes))
            nbytes, is_host = storage.nbytes(), in_host_pool()
            self.live[key] = (StorageWeakRef(storage), nbytes, is_host)
            if is_host:
                self.host += nbytes
            else:
                self.device += nbytes
        # sweep only when a new peak is about to be recorded: the un-swept total is an upper bound
        if self.device > self.peak_device or self.host > self.peak_host:
            self._sweep()
            self.peak_device = max(self.peak_device, self.device)
            self.peak_host = max(self.peak_host, self.host)
            if self.budget is not None and self.device > self.budget:
                self.exceeded = True
                raise MemoryBudgetExceeded(self.device, self.budget)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self._track(out)
        return out


def measure(fn, budget=None):
    """Run ``fn()`` under a tracker; returns ``(result or None, tracker)``: ``None`` and
    ``tracker.exceeded`` when the device bytes passed ``budget``."""
    tracker = TrackedTensorMemory(budget)
    try:
        with tracker:
            result = fn()
    except MemoryBudgetExceeded:
        return None, tracker
    return result, tracker
