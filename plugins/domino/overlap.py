"""The asynchronous tensor-parallel all-reduce Domino overlaps with compute, and the trace
that shows it happening.

Plain tensor parallelism ends every attention and MLP block with a blocking all-reduce
(Megatron's "g"): the rank idles while the partial sums travel. Domino launches that
all-reduce *asynchronously* and hands back a ``PendingAllReduce``; the caller computes
something that does not need the result (the other half of the batch) and only then calls
``get()``, which waits and applies the block's epilogue (bias + residual).

Autograd sees ``start_all_reduce`` as "g": all-reduce forward, identity backward, so the
gradients are those of plain tensor parallelism. The backward all-reduce ("f") is overlapped
inside ``DominoAsyncColumnParallelLinear`` (see ``layers``).

``record_overlap()`` turns on a ``OverlapTrace``: every launch, wait and compute span is
appended in program order with a timestamp, so a test can check the order (launch of chunk
0's all-reduce < chunk 1's matmuls < wait of chunk 0's all-reduce) without timing assertions,
and a benchmark can measure how much of the all-reduce time was hidden.
"""
import contextlib
import time

import torch

from deepspeed import comm as dist

_active_trace = None


class OverlapTrace:
    """Events ``(kind, label, seconds)`` in program order. Kinds: ``launch`` (an async
    all-reduce started), ``wait`` / ``waited`` (the wait on it began / returned),
    ``compute`` / ``computed`` (a span of matmul work began / ended)."""

    def __init__(self):
        self.events = []

    def add(self, kind, label):
        self.events.append((kind, label, time.perf_counter()))

    def index(self, kind, label):
        """Position of the first ``kind`` event named ``label`` (ValueError if none)."""
        for i, (k, name, _) in enumerate(self.events):
            if k == kind and name == label:
                return i
        raise ValueError(f"no {kind!r} event named {label!r} in the trace: {self.labels()}")

    def labels(self):
        return [(kind, label) for kind, label, _ in self.events]

    def overlapped(self):
        """How many all-reduces had a compute span start between their launch and their wait
        (the all-reduces that traveled while something else computed)."""
        count, in_flight = 0, {}
        for kind, label, _ in self.events:
            if kind == "launch":
                in_flight[label] = False
            elif kind == "compute":
                in_flight = dict.fromkeys(in_flight, True)
            elif kind == "wait":
                count += in_flight.pop(label, False)
        return count

    def wait_seconds(self):
        """Total time spent blocked in waits (the all-reduce time *not* hidden)."""
        total, began = 0.0, {}
        for kind, label, t in self.events:
            if kind == "wait":
                began[label] = t
            elif kind == "waited":
                total += t - began.pop(label)
        return total


def trace_event(kind, label):
    if _active_trace is not None:
        _active_trace.add(kind, label)


@contextlib.contextmanager
def traced_compute(label):
    """Marks a span of compute in the active trace (nothing when none is active)."""
    trace_event("compute", label)
    try:
        yield
    finally:
        trace_event("computed", label)


@contextlib.contextmanager
def record_overlap():
    """Record the Domino launches, waits and compute spans of this process into the
    ``OverlapTrace`` yielded (forward and backward)."""
    global _active_trace
    previous, _active_trace = _active_trace, OverlapTrace()
    try:
        yield _active_trace
    finally:
        _active_trace = previous


def launch_all_reduce(tensor, group, label, async_op=True):
    """All-reduce ``tensor`` in place over ``group``: the work handle when ``async_op`` (wait
    with ``wait_all_reduce``), else None once done (traced as a launch waited on at once)."""
    trace_event("launch", label)
    if async_op:
        return dist.all_reduce(tensor, group=group, async_op=True)
    trace_event("wait", label)
    dist.all_reduce(tensor, group=group)
    trace_event("waited", label)
    return None


def wait_all_reduce(work, label):
    if work is not None:
        trace_event("wait", label)
        work.wait()
        trace_event("waited", label)


class _StartAllReduce(torch.autograd.Function):
    """Forward: a copy of ``x`` whose all-reduce over ``group`` has been launched (the work
    handle goes into ``box``); backward: identity (Megatron's "g")."""

    @staticmethod
    def forward(ctx, x, group, box, label, async_op):
        out = x.contiguous().clone()
        box.work = launch_all_reduce(out, group, label, async_op)
        return out

    @staticmethod
    def backward(ctx, grad):
        return grad, None, None, None, None


class _Box:
    work = None


class PendingAllReduce:
    """Partial sums whose all-reduces are in flight: one tensor, or the pieces of one along
    the last (hidden) dimension, each launched by ``add`` as soon as it is computed so that it
    travels while the next piece is. ``get()`` waits for them once and returns
    ``epilogue(reduced)`` (the pieces concatenated; bias and residual added); later calls
    return the same tensor."""

    def __init__(self, group, label, epilogue=None, async_op=True, partial=None):
        self.group, self.label, self.epilogue, self.async_op = group, label, epilogue, async_op
        self.pieces, self.result = [], None
        if partial is not None:
            self.add(partial)

    def add(self, partial, piece=None):
        """Launch the all-reduce of ``partial`` (the next hidden piece when ``piece`` is
        given, traced as ``"<label> piece <piece>"``)."""
        label = self.label if piece is None else f"{self.label} piece {piece}"
        box = _Box()
        reduced = _StartAllReduce.apply(partial, self.group, box, label, self.async_op)
        self.pieces.append((reduced, box.work, label))
        return self

    def get(self):
        if self.result is None:
            for _, work, label in self.pieces:
                wait_all_reduce(work, label)
            parts = [reduced for reduced, _, _ in self.pieces]
            self.pieces = []
            reduced = parts[0] if len(parts) == 1 else torch.cat(parts, dim=-1)
            self.result = reduced if self.epilogue is None else self.epilogue(reduced)
        return self.result


class Ready:
    """A value with nothing in flight, read through the same ``get()``."""

    def __init__(self, value):
        self.result = value

    def get(self):
        return self.result
