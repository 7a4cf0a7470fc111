"""The CUDA accelerator: a thin mapping onto `torch.cuda` with NCCL for collectives.

It imports on machines without a GPU (ds_report lists it, DS_ACCELERATOR=cuda can force it); calls
that need a device then fail inside torch with torch's own message.
"""
from __future__ import annotations

import importlib.util

import torch

from deepspeed.accelerator.abstract_accelerator import DeepSpeedAccelerator
from deepspeed.accelerator.tensor_types import LegacyTensorType

_TRITON_MIN_CAPABILITY = (8, 0)  # the oldest NVIDIA architecture Triton supports


class CUDA_Accelerator(DeepSpeedAccelerator):

    def __init__(self):
        self._name = "cuda"
        self._communication_backend_name = "nccl"
        self._compile_backend = "inductor"

    def _index(self, device_index):
        return torch.cuda.current_device() if device_index is None else device_index

    # ------------------------------------------------------------------ device
    def device_name(self, device_index=None):
        return "cuda" if device_index is None else f"cuda:{device_index}"

    def device(self, device_index=None):
        return torch.cuda.device(device_index)

    def set_device(self, device_index):
        torch.cuda.set_device(device_index)

    def current_device(self):
        return torch.cuda.current_device()

    def current_device_name(self):
        return f"cuda:{torch.cuda.current_device()}"

    def device_count(self):
        return torch.cuda.device_count()

    def synchronize(self, device_index=None):
        return torch.cuda.synchronize(device_index)

    def is_available(self):
        return torch.cuda.is_available()

    def is_synchronized_device(self):
        return False

    def use_host_timers(self):
        return False

    def resolves_data_dependency(self):
        return False

    def handles_memory_backpressure(self):
        return False

    # --------------------------------------------------------------------- RNG
    def random(self):
        return torch.random

    def set_rng_state(self, new_state, device_index=None):
        if device_index is None:
            return torch.cuda.set_rng_state(new_state)
        return torch.cuda.set_rng_state(new_state, device_index)

    def get_rng_state(self, device_index=None):
        if device_index is None:
            return torch.cuda.get_rng_state()
        return torch.cuda.get_rng_state(device_index)

    def manual_seed(self, seed):
        return torch.cuda.manual_seed(seed)

    def manual_seed_all(self, seed):
        return torch.cuda.manual_seed_all(seed)

    def initial_seed(self):
        return torch.cuda.initial_seed()

    def default_generator(self, device_index):
        torch.cuda.init()  # default_generators is empty until CUDA is initialised
        return torch.cuda.default_generators[device_index]

    # ---------------------------------------------------------- streams/events
    @property
    def Stream(self):
        return torch.cuda.Stream

    def stream(self, stream):
        return torch.cuda.stream(stream)

    def current_stream(self, device_index=None):
        return torch.cuda.current_stream(device_index)

    def default_stream(self, device_index=None):
        return torch.cuda.default_stream(device_index)

    @property
    def Event(self):
        return torch.cuda.Event

    # ------------------------------------------------------------------ memory
    def empty_cache(self):
        return torch.cuda.empty_cache()

    def memory_allocated(self, device_index=None):
        return torch.cuda.memory_allocated(device_index)

    def max_memory_allocated(self, device_index=None):
        return torch.cuda.max_memory_allocated(device_index)

    def reset_max_memory_allocated(self, device_index=None):
        # torch.cuda.reset_max_memory_allocated is deprecated in favour of this call
        return torch.cuda.reset_peak_memory_stats(device_index)

    def memory_reserved(self, device_index=None):
        return torch.cuda.memory_reserved(device_index)

    def max_memory_reserved(self, device_index=None):
        return torch.cuda.max_memory_reserved(device_index)

    def reset_peak_memory_stats(self, device_index=None):
        return torch.cuda.reset_peak_memory_stats(device_index)

    def memory_stats(self, device_index=None):
        return torch.cuda.memory_stats(device_index)

    def total_memory(self, device_index=None):
        return torch.cuda.get_device_properties(self._index(device_index)).total_memory

    def available_memory(self, device_index=None):
        free, _total = torch.cuda.mem_get_info(self._index(device_index))
        return free

    # ------------------------------------------------------------------ dtypes
    def is_bf16_supported(self):
        return torch.cuda.is_available() and torch.cuda.is_bf16_supported()

    def is_fp16_supported(self):
        """Every GPU the installed torch can run on computes in fp16."""
        return torch.cuda.is_available()

    def amp(self):
        return torch.cuda.amp

    # ------------------------------------------------------------ misc runtime
    def range_push(self, msg):
        return torch.cuda.nvtx.range_push(msg)

    def range_pop(self):
        return torch.cuda.nvtx.range_pop()

    def lazy_call(self, callback):
        return torch.cuda._lazy_call(callback)

    def communication_backend_name(self):
        return self._communication_backend_name

    def is_triton_supported(self):
        if not torch.cuda.is_available() or importlib.util.find_spec("triton") is None:
            return False
        return torch.cuda.get_device_capability() >= _TRITON_MIN_CAPABILITY

    # ---------------------------------------------------------- graph capture
    def create_graph(self):
        return torch.cuda.CUDAGraph()

    def capture_to_graph(self, graph, pool=None, stream=None):
        return torch.cuda.graph(graph, pool=pool, stream=stream)

    def replay_graph(self, graph):
        return graph.replay()

    # ----------------------------------------------------------- tensor types
    @property
    def BFloat16Tensor(self):
        return LegacyTensorType(torch.bfloat16, "cuda")

    @property
    def ByteTensor(self):
        return LegacyTensorType(torch.uint8, "cuda")

    @property
    def DoubleTensor(self):
        return LegacyTensorType(torch.float64, "cuda")

    @property
    def FloatTensor(self):
        return LegacyTensorType(torch.float32, "cuda")

    @property
    def HalfTensor(self):
        return LegacyTensorType(torch.float16, "cuda")

    @property
    def IntTensor(self):
        return LegacyTensorType(torch.int32, "cuda")

    @property
    def LongTensor(self):
        return LegacyTensorType(torch.int64, "cuda")

    # --------------------------------------------------------- host tensors
    def pin_memory(self, tensor, align_bytes=1):
        return tensor.pin_memory()

    def is_pinned(self, tensor):
        return tensor.is_pinned()

    def on_accelerator(self, tensor):
        return tensor.device.type == "cuda"

    # ------------------------------------------------------------- launcher
    def export_envs(self):
        return ["NCCL"]

    def visible_devices_envs(self):
        return ["CUDA_VISIBLE_DEVICES"]
