"""The contract every accelerator fulfils.

Model and engine code call `get_accelerator().X()` instead of `torch.cuda.X()`, so one code path
runs on CUDA, CPU or a vendor device shipped as a separate package. The abstract methods below are
what a device must answer itself; the concrete ones (op builder lookup, compile backend, dtype
list, legacy aliases) derive from them so an extension does not re-implement them.
"""
from __future__ import annotations

import abc

from deepspeed.accelerator import registry
from deepspeed.utils.lazy_module import lazy_module

torch = lazy_module("torch")  # loads on first use: the launcher asks device counts without torch

DEFAULT_OP_BUILDER_MODULE = "deepspeed.ops.op_builder"


class DeepSpeedAccelerator(abc.ABC):
    """Base class of all accelerators; subclasses set `_name` and `_communication_backend_name`."""

    _name: str = None
    _communication_backend_name: str = None
    _compile_backend: str = "inductor"

    # ------------------------------------------------------------------ device
    @property
    def name(self):
        """The accelerator's registered name (``DS_ACCELERATOR`` / ``set_accelerator``), which
        ``ds_report`` and error messages show; subclasses set it as ``_name``."""
        return self._name

    @abc.abstractmethod
    def device_name(self, device_index=None):
        """The torch device string for `device_index` ('cuda:1'), or the bare type when None."""

    @abc.abstractmethod
    def device(self, device_index=None):
        """A context manager that makes `device_index` current inside a `with` block."""

    @abc.abstractmethod
    def set_device(self, device_index):
        """Make `device_index` the current device of this process."""

    @abc.abstractmethod
    def current_device(self):
        """The index (int) of the current device."""

    @abc.abstractmethod
    def current_device_name(self):
        """The torch device string of the current device, usable as `device=`."""

    @abc.abstractmethod
    def device_count(self):
        """How many devices this node offers; the launcher's default worker count."""

    @abc.abstractmethod
    def synchronize(self, device_index=None):
        """Block the host until queued work on the device has finished."""

    @abc.abstractmethod
    def is_available(self):
        """Whether the device can be used in this process."""

    @abc.abstractmethod
    def is_synchronized_device(self):
        """True when device work completes before the host call returns (no async queue)."""

    @abc.abstractmethod
    def use_host_timers(self):
        """True when host wall-clock timers measure device work correctly (no events needed)."""

    @abc.abstractmethod
    def resolves_data_dependency(self):
        """True when reading a tensor on the host needs no explicit stream synchronisation."""

    @abc.abstractmethod
    def handles_memory_backpressure(self):
        """True when the device never runs ahead of the host far enough to exhaust memory."""

    # --------------------------------------------------------------------- RNG
    @abc.abstractmethod
    def random(self):
        """The module holding torch's generic RNG functions (`torch.random`)."""

    @abc.abstractmethod
    def set_rng_state(self, new_state, device_index=None):
        """Restore the device RNG state saved by `get_rng_state`."""

    @abc.abstractmethod
    def get_rng_state(self, device_index=None):
        """The device RNG state as a ByteTensor (activation checkpointing replays it)."""

    @abc.abstractmethod
    def manual_seed(self, seed):
        """Seed the RNG of the current device."""

    @abc.abstractmethod
    def manual_seed_all(self, seed):
        """Seed the RNG of every device of this process."""

    @abc.abstractmethod
    def initial_seed(self):
        """The seed the current device RNG started from."""

    @abc.abstractmethod
    def default_generator(self, device_index):
        """The default `torch.Generator` of a device (`torch.cuda.default_generators[i]`)."""

    # ---------------------------------------------------------- streams/events
    @property
    @abc.abstractmethod
    def Stream(self):
        """The stream class; `Stream()` creates a side stream."""

    @abc.abstractmethod
    def stream(self, stream):
        """A context manager that makes `stream` current."""

    @abc.abstractmethod
    def current_stream(self, device_index=None):
        """The stream work is queued on right now."""

    @abc.abstractmethod
    def default_stream(self, device_index=None):
        """The device's default stream."""

    @property
    @abc.abstractmethod
    def Event(self):
        """The event class (`record`, `wait`, `synchronize`, `query`, `elapsed_time`)."""

    # ------------------------------------------------------------------ memory
    @abc.abstractmethod
    def empty_cache(self):
        """Return cached, unused device memory to the system."""

    @abc.abstractmethod
    def memory_allocated(self, device_index=None):
        """Bytes currently held by live tensors."""

    @abc.abstractmethod
    def max_memory_allocated(self, device_index=None):
        """Peak of `memory_allocated` since start or the last reset."""

    @abc.abstractmethod
    def reset_max_memory_allocated(self, device_index=None):
        """Restart peak tracking of `max_memory_allocated` from the current value."""

    @abc.abstractmethod
    def memory_reserved(self, device_index=None):
        """Bytes held by the allocator, used or cached."""

    @abc.abstractmethod
    def max_memory_reserved(self, device_index=None):
        """Peak of `memory_reserved` since start or the last reset."""

    @abc.abstractmethod
    def reset_peak_memory_stats(self, device_index=None):
        """Restart every peak counter from the current values."""

    @abc.abstractmethod
    def memory_stats(self, device_index=None):
        """A dict of counters keyed like `torch.cuda.memory_stats` ('allocated_bytes.all.peak')."""

    @abc.abstractmethod
    def total_memory(self, device_index=None):
        """Total bytes of device memory."""

    @abc.abstractmethod
    def available_memory(self, device_index=None):
        """Bytes that could still be allocated now."""

    # Legacy names kept because older user code and the docs still call them.
    def memory_cached(self, device_index=None):
        """Old name of `memory_reserved`."""
        return self.memory_reserved(device_index)

    def max_memory_cached(self, device_index=None):
        """Old name of `max_memory_reserved`."""
        return self.max_memory_reserved(device_index)

    def reset_max_memory_cached(self, device_index=None):
        """Old name of `reset_peak_memory_stats`, which also restarts the reserved peak."""
        return self.reset_peak_memory_stats(device_index)

    # ------------------------------------------------------------------ dtypes
    @abc.abstractmethod
    def is_bf16_supported(self):
        """Whether bf16 tensors compute correctly on this device."""

    @abc.abstractmethod
    def is_fp16_supported(self):
        """Whether fp16 tensors compute correctly on this device."""

    def supported_dtypes(self):
        """Floating dtypes training may use here; fp32 is always present."""
        dtypes = [torch.float32]
        if self.is_bf16_supported():
            dtypes.append(torch.bfloat16)
        if self.is_fp16_supported():
            dtypes.append(torch.float16)
        return dtypes

    @abc.abstractmethod
    def amp(self):
        """The device's autocast module (`torch.cuda.amp`, `torch.cpu.amp`)."""

    # ------------------------------------------------------------ misc runtime
    @abc.abstractmethod
    def range_push(self, msg):
        """Open a named range visible in the device profiler."""

    @abc.abstractmethod
    def range_pop(self):
        """Close the innermost range opened by `range_push`."""

    @abc.abstractmethod
    def lazy_call(self, callback):
        """Run `callback` once the device runtime is initialised (now, if it already is)."""

    @abc.abstractmethod
    def communication_backend_name(self):
        """The `torch.distributed` backend for this device ('nccl', 'gloo', 'ccl', ...)."""

    @abc.abstractmethod
    def is_triton_supported(self):
        """Whether Triton kernels can run on this device."""

    # ---------------------------------------------------------- graph capture
    @abc.abstractmethod
    def create_graph(self):
        """A new capture graph, or None where the device cannot capture graphs."""

    @abc.abstractmethod
    def capture_to_graph(self, graph, pool=None, stream=None):
        """A context manager that records the work done inside it into `graph`."""

    @abc.abstractmethod
    def replay_graph(self, graph):
        """Re-run the work recorded in `graph`."""

    # ----------------------------------------------------------- tensor types
    @property
    @abc.abstractmethod
    def BFloat16Tensor(self):
        """Constructor of bf16 tensors on this device (legacy `torch.cuda.BFloat16Tensor`)."""

    @property
    @abc.abstractmethod
    def ByteTensor(self):
        """Constructor of uint8 tensors on this device."""

    @property
    @abc.abstractmethod
    def DoubleTensor(self):
        """Constructor of fp64 tensors on this device."""

    @property
    @abc.abstractmethod
    def FloatTensor(self):
        """Constructor of fp32 tensors on this device."""

    @property
    @abc.abstractmethod
    def HalfTensor(self):
        """Constructor of fp16 tensors on this device."""

    @property
    @abc.abstractmethod
    def IntTensor(self):
        """Constructor of int32 tensors on this device."""

    @property
    @abc.abstractmethod
    def LongTensor(self):
        """Constructor of int64 tensors on this device."""

    # --------------------------------------------------------- host tensors
    @abc.abstractmethod
    def pin_memory(self, tensor, align_bytes=1):
        """`tensor` in page-locked host memory, for fast asynchronous copies to the device."""

    @abc.abstractmethod
    def is_pinned(self, tensor):
        """Whether `tensor` lives in page-locked host memory."""

    @abc.abstractmethod
    def on_accelerator(self, tensor):
        """Whether `tensor` lives on this accelerator (the portable `tensor.is_cuda`)."""

    # ----------------------------------------------------------- op builders
    def op_builder_dir(self):
        """Module searched for op builders that no `deepspeed.op_builders` entry point provides.

        A vendor accelerator overrides this to point at its own builder module.
        """
        return DEFAULT_OP_BUILDER_MODULE

    def get_op_builder(self, class_name):
        """The builder class named `class_name`, or None when no installed package provides it."""
        return registry.find_op_builder(class_name, self.op_builder_dir())

    def create_op_builder(self, class_name):
        """An instance of the builder class named `class_name`, or None when it is unknown."""
        builder_class = self.get_op_builder(class_name)
        return None if builder_class is None else builder_class()

    def build_extension(self):
        """The setuptools command class that compiles native ops for this device."""
        from torch.utils.cpp_extension import BuildExtension

        return BuildExtension

    # ------------------------------------------------------------- launcher
    @abc.abstractmethod
    def export_envs(self):
        """Prefixes of environment variables the multi-node launcher forwards to remote workers."""

    @abc.abstractmethod
    def visible_devices_envs(self):
        """Environment variables that restrict which devices a worker sees."""

    def set_visible_devices_envs(self, current_env, local_accelerator_ids):
        """Write the device ids a worker may use into `current_env` (a dict of env vars)."""
        ids = list(local_accelerator_ids)
        bad = [i for i in ids if isinstance(i, bool) or not isinstance(i, int) or i < 0]
        if bad:
            raise ValueError(f"local_accelerator_ids must be non-negative ints, got {bad!r} in {ids!r}")
        for name in self.visible_devices_envs():
            current_env[name] = ",".join(str(i) for i in ids)

    # --------------------------------------------------------- torch.compile
    def get_compile_backend(self):
        """The `torch.compile` backend the engine uses on this device."""
        return self._compile_backend

    def set_compile_backend(self, backend):
        """Choose the `torch.compile` backend: a registered backend name or a callable."""
        if callable(backend):
            self._compile_backend = backend
            return
        import torch._dynamo

        known = torch._dynamo.list_backends(exclude_tags=())
        if backend not in known:
            raise ValueError(f"compile backend {backend!r} is not registered with torch._dynamo; "
                             f"available: {', '.join(sorted(known))}")
        self._compile_backend = backend

    def __repr__(self):
        return f"<{type(self).__name__} name={self._name!r} backend={self._communication_backend_name!r}>"
