"""Contiguous buffers for partitioned activations (`contiguous_memory_optimization`).

Saving each checkpoint's partition as its own small tensor fragments the allocator when a model
has many layers; instead, argument position i of every checkpoint in one forward pass gets a slot
in one preallocated buffer of `number_checkpoints` slots. That only works for homogeneous
checkpoints (same partition size and dtype at a position), which is checked here.

A backward pass (or `reset()`) drops the buffers: the saved slot views keep the memory alive until
autograd frees them, and the next forward allocates afresh.
"""
from typing import Dict, Optional

import torch

from deepspeed.accelerator import get_accelerator


class _Buffer:
    def __init__(self, slots: int, template: torch.Tensor, device: torch.device):
        self.slot_numel = template.numel()
        self.dtype = template.dtype
        self.device = device
        self.data = torch.empty(slots * self.slot_numel, dtype=template.dtype, device=device)
        if self.device.type == "cpu" and get_accelerator().device_name() != "cpu":
            # host copies of device activations: pinned so the copy back can be asynchronous
            self.data = get_accelerator().pin_memory(self.data)
        self.used = 0


class ContiguousBuffers:
    """One buffer per checkpoint argument position, each with `slots` equal slots."""

    def __init__(self, slots: Optional[int] = None):
        self.slots = slots
        self._buffers: Dict[int, _Buffer] = {}

    @property
    def enabled(self) -> bool:
        return self.slots is not None

    def __len__(self) -> int:
        """How many argument positions hold a buffer right now."""
        return len(self._buffers)

    def store(self, position: int, flat: torch.Tensor, device: torch.device) -> torch.Tensor:
        """Copy the 1-D `flat` into the next free slot for `position`, in a buffer on `device`
        (the host with cpu_checkpointing); return that slot's view."""
        if not self.enabled:
            raise RuntimeError("contiguous buffers are disabled (contiguous_memory_optimization is "
                               "false), so nothing may be stored in them")
        buffer = self._buffers.get(position)
        if buffer is None:
            buffer = self._buffers[position] = _Buffer(self.slots, flat, torch.device(device))
        if (flat.numel(), flat.dtype, torch.device(device)) != (buffer.slot_numel, buffer.dtype,
                                                               buffer.device):
            raise AssertionError(
                f"contiguous_memory_optimization needs homogeneous checkpoints: argument "
                f"{position} has a partition of {flat.numel()} {flat.dtype} elements for "
                f"{device}, but the buffer slots hold {buffer.slot_numel} {buffer.dtype} on "
                f"{buffer.device}")
        if buffer.used >= self.slots:
            raise RuntimeError(
                f"more checkpoint() calls in one forward pass than "
                f"number_checkpoints={self.slots}: raise number_checkpoints, or call "
                f"deepspeed.checkpointing.reset() after forward passes that have no backward")
        # A tensor of its own over the slot, not a narrow() view: views share the buffer's
        # version counter, so filling the next slot would look like an in-place change of this
        # one to autograd's saved-tensor check.
        offset = buffer.data.storage_offset() + buffer.used * buffer.slot_numel
        slot = torch.empty(0, dtype=buffer.dtype, device=buffer.device).set_(
            buffer.data.untyped_storage(), offset, (buffer.slot_numel,))
        slot.copy_(flat)
        buffer.used += 1
        return slot

    def release(self) -> None:
        self._buffers = {}
