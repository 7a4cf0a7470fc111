"""The CPU accelerator: the default wherever torch sees no GPU.

CPU work is synchronous, so streams, events and synchronize are host-side no-ops that keep the
engine's code path identical to the GPU one. Inside a launched job a "device" is one local rank
(the launcher's ``LOCAL_SIZE`` of them), so code that checks ``world_size <= device_count()``
works on CPU; outside one it is a NUMA node, which is what the launcher binds one worker to. Memory counters read the process RSS, the closest CPU analogue of
`torch.cuda.memory_allocated`.
"""
from __future__ import annotations

import contextlib
import glob
import os
import time

import psutil

from deepspeed.accelerator.abstract_accelerator import DeepSpeedAccelerator
from deepspeed.utils.lazy_module import lazy_module

torch = lazy_module("torch")  # loads on first use: the launcher asks device counts without torch


def _numa_node_count():
    """NUMA nodes that own CPUs (memory-only nodes have an empty cpulist); at least 1."""
    count = 0
    for node in glob.glob("/sys/devices/system/node/node[0-9]*"):
        cpulist = os.path.join(node, "cpulist")
        if os.path.isfile(cpulist):
            with open(cpulist) as handle:
                if handle.read().strip():
                    count += 1
    return max(count, 1)


def _communication_backend():
    """'ccl' when Intel's oneCCL bindings can register the backend, else 'gloo'."""
    try:
        import oneccl_bindings_for_pytorch  # noqa: F401  (registers the 'ccl' backend)
    except ImportError:
        return "gloo"
    return "ccl"


class HostEvent:
    """An event on a synchronous device: recording stamps the host clock."""

    def __init__(self, enable_timing=False, blocking=False, interprocess=False):
        self.enable_timing = enable_timing
        self._recorded_at = None

    def record(self, stream=None):
        self._recorded_at = time.perf_counter()

    def wait(self, stream=None):
        """Nothing to wait for: the recorded work is already done."""

    def synchronize(self):
        """Nothing to wait for: the recorded work is already done."""

    def query(self):
        return True

    def elapsed_time(self, end_event):
        """Milliseconds between this event and `end_event`, like `torch.cuda.Event.elapsed_time`."""
        if self._recorded_at is None or end_event._recorded_at is None:
            raise RuntimeError("Both events must be recorded before calculating elapsed time.")
        return (end_event._recorded_at - self._recorded_at) * 1000.0


class HostStream:
    """A stream on a synchronous device: every operation has finished when it returns."""

    def __init__(self, device=None, priority=0, **kwargs):
        self.priority = priority

    @property
    def device(self):
        return torch.device("cpu")

    def synchronize(self):
        """Work is already complete."""

    def wait_stream(self, stream):
        """Work is already complete."""

    def wait_event(self, event):
        """Work is already complete."""

    def record_event(self, event=None):
        event = event if event is not None else HostEvent()
        event.record(self)
        return event

    def query(self):
        return True


_DEFAULT_STREAM = HostStream()


class CPU_Accelerator(DeepSpeedAccelerator):

    def __init__(self):
        self._name = "cpu"
        self._communication_backend_name = _communication_backend()
        self._compile_backend = "inductor"
        self._device_index = None
        self._numa_nodes = None
        self._fp16_supported = None
        self._peak_allocated = 0
        self._peak_reserved = 0
        self._open_ranges = []

    # ------------------------------------------------------------------ device
    def device_name(self, device_index=None):
        return "cpu"

    def device(self, device_index=None):
        """A no-op context: there is one CPU device type and tensors never change place."""
        return contextlib.nullcontext(torch.device("cpu"))

    def set_device(self, device_index):
        if isinstance(device_index, torch.device):
            device_index = 0 if device_index.index is None else device_index.index
        if isinstance(device_index, bool) or not isinstance(device_index, int) or device_index < 0:
            raise ValueError(f"set_device() needs a non-negative int index, got {device_index!r}")
        self._device_index = device_index

    def current_device(self):
        """The index given to set_device(), else LOCAL_RANK (one logical device per worker)."""
        if self._device_index is not None:
            return self._device_index
        local_rank = os.environ.get("LOCAL_RANK", "0")
        try:
            return int(local_rank)
        except ValueError:
            raise ValueError(f"LOCAL_RANK must be an integer, got {local_rank!r}") from None

    def current_device_name(self):
        return "cpu"

    def device_count(self):
        """``LOCAL_SIZE`` inside a job the launcher started (one logical device per local rank,
        as ``current_device()`` is the local rank); else the NUMA nodes that own CPUs."""
        local_size = os.environ.get("LOCAL_SIZE", "")
        if local_size:
            try:
                count = int(local_size)
            except ValueError:
                raise ValueError(f"LOCAL_SIZE must be a positive integer, got {local_size!r}") from None
            if count < 1:
                raise ValueError(f"LOCAL_SIZE must be a positive integer, got {local_size!r}")
            return count
        if self._numa_nodes is None:
            self._numa_nodes = _numa_node_count()
        return self._numa_nodes

    def synchronize(self, device_index=None):
        """CPU kernels finish before they return; there is no queue to drain."""

    def is_available(self):
        return True

    def is_synchronized_device(self):
        return True

    def use_host_timers(self):
        return True

    def resolves_data_dependency(self):
        return True

    def handles_memory_backpressure(self):
        return True

    # --------------------------------------------------------------------- RNG
    def random(self):
        return torch.random

    def set_rng_state(self, new_state, device_index=None):
        torch.set_rng_state(new_state)

    def get_rng_state(self, device_index=None):
        return torch.get_rng_state()

    def manual_seed(self, seed):
        return torch.manual_seed(seed)

    def manual_seed_all(self, seed):
        return torch.manual_seed(seed)

    def initial_seed(self):
        return torch.initial_seed()

    def default_generator(self, device_index):
        return torch.default_generator

    # ---------------------------------------------------------- streams/events
    @property
    def Stream(self):
        return HostStream

    def stream(self, stream):
        return contextlib.nullcontext(stream)

    def current_stream(self, device_index=None):
        return _DEFAULT_STREAM

    def default_stream(self, device_index=None):
        return _DEFAULT_STREAM

    @property
    def Event(self):
        return HostEvent

    # ------------------------------------------------------------------ memory
    def _rss(self):
        """Resident bytes of this process; updates both peaks so they never lag a reading."""
        rss = psutil.Process().memory_info().rss
        self._peak_allocated = max(self._peak_allocated, rss)
        self._peak_reserved = max(self._peak_reserved, rss)
        return rss

    def empty_cache(self):
        """The CPU allocator keeps no cache of its own: freed tensors go straight back to malloc."""

    def memory_allocated(self, device_index=None):
        return self._rss()

    def max_memory_allocated(self, device_index=None):
        self._rss()
        return self._peak_allocated

    def reset_max_memory_allocated(self, device_index=None):
        self._peak_allocated = psutil.Process().memory_info().rss

    def memory_reserved(self, device_index=None):
        """Everything resident counts as reserved: there is no allocator cache to tell apart."""
        return self._rss()

    def max_memory_reserved(self, device_index=None):
        self._rss()
        return self._peak_reserved

    def reset_peak_memory_stats(self, device_index=None):
        rss = psutil.Process().memory_info().rss
        self._peak_allocated = rss
        self._peak_reserved = rss

    def memory_stats(self, device_index=None):
        current = self._rss()
        return {
            "allocated_bytes.all.current": current,
            "allocated_bytes.all.peak": self._peak_allocated,
            "reserved_bytes.all.current": current,
            "reserved_bytes.all.peak": self._peak_reserved,
            "total_bytes": self.total_memory(),
            "available_bytes": self.available_memory(),
        }

    def total_memory(self, device_index=None):
        return psutil.virtual_memory().total

    def available_memory(self, device_index=None):
        return psutil.virtual_memory().available

    # ------------------------------------------------------------------ dtypes
    def is_bf16_supported(self):
        return True

    def is_fp16_supported(self):
        """True when torch's CPU kernels compute in fp16 (current torch has them for core ops).

        This answers "does fp16 work", not "is it fast": CPUs without AVX512-FP16/AMX-FP16 run
        it through conversions. Probed once so an old torch without the kernels says False.
        """
        if self._fp16_supported is None:
            sample = torch.ones(4, 4, dtype=torch.float16)
            try:
                torch.nn.functional.layer_norm(torch.softmax(sample @ sample, dim=-1), (4,))
            except RuntimeError:  # "... not implemented for 'Half'"
                self._fp16_supported = False
            else:
                self._fp16_supported = True
        return self._fp16_supported

    def amp(self):
        return torch.cpu.amp

    # ------------------------------------------------------------ misc runtime
    def range_push(self, msg):
        """Open a `record_function` range so the PyTorch profiler shows it on CPU too."""
        scope = torch.autograd.profiler.record_function(msg)
        scope.__enter__()
        self._open_ranges.append(scope)
        return len(self._open_ranges) - 1

    def range_pop(self):
        """Close the innermost open range; -1 when none is open (as nvtx reports)."""
        if not self._open_ranges:
            return -1
        self._open_ranges.pop().__exit__(None, None, None)
        return len(self._open_ranges)

    def lazy_call(self, callback):
        """The CPU runtime is always initialised, so the callback runs now."""
        return callback()

    def communication_backend_name(self):
        return self._communication_backend_name

    def is_triton_supported(self):
        """False: Triton has no supported CPU backend (TRITON_INTERPRET=1 is a test mode)."""
        return False

    # ---------------------------------------------------------- graph capture
    def create_graph(self):
        """None: CPUs cannot capture graphs; callers test for None before capturing."""
        return None

    def capture_to_graph(self, graph, pool=None, stream=None):
        """Runs the block eagerly; with no graph there is nothing to record."""
        return contextlib.nullcontext()

    def replay_graph(self, graph):
        """Nothing was recorded (see create_graph), so there is nothing to replay."""

    # ----------------------------------------------------------- tensor types
    @property
    def BFloat16Tensor(self):
        return torch.BFloat16Tensor

    @property
    def ByteTensor(self):
        return torch.ByteTensor

    @property
    def DoubleTensor(self):
        return torch.DoubleTensor

    @property
    def FloatTensor(self):
        return torch.FloatTensor

    @property
    def HalfTensor(self):
        return torch.HalfTensor

    @property
    def IntTensor(self):
        return torch.IntTensor

    @property
    def LongTensor(self):
        return torch.LongTensor

    # --------------------------------------------------------- host tensors
    def pin_memory(self, tensor, align_bytes=1):
        """`tensor` itself: pinning speeds DMA to a device, and the CPU accelerator has none."""
        return tensor

    def is_pinned(self, tensor):
        return tensor.is_pinned()

    def on_accelerator(self, tensor):
        return tensor.device.type == "cpu"

    # ------------------------------------------------------------- launcher
    def export_envs(self):
        """Settings of the CPU communication libraries (gloo, oneCCL, Intel MPI, libfabric)."""
        return ["GLOO", "CCL", "I_MPI", "FI_"]

    def visible_devices_envs(self):
        """CUDA_VISIBLE_DEVICES, as upstream: the launcher narrows it per worker on every device."""
        return ["CUDA_VISIBLE_DEVICES"]
