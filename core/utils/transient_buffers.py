"""Large short-lived host buffers that go back to the operating system the moment they die.

ZeRO allocates a few big buffers every step and frees them again: all-gather outputs of whole
modules, the gradient bucket that is reduce-scattered. Through glibc's ``malloc`` each such free
of an mmap-served chunk raises the process's *dynamic mmap threshold* to that chunk's size (up
to 32 MiB), after which every allocation below it - activations included - is served from the
heap, whose freed pages stay resident. The live memory is the same, but the peak RSS grows by
the heap's slack: measured +25-30 MiB per rank on the 3.2 M-parameter GPT of
``tools/bench/zero_bench.py``, where the per-parameter implementation never freed anything
larger than one parameter.

``transient_empty`` serves such buffers from an anonymous ``mmap`` of their own instead: torch
keeps the mapping alive as long as the tensor's storage, and when the storage dies the mapping
is unmapped, without glibc ever seeing the allocation. Small buffers and accelerator tensors go
through ``torch.empty`` as usual.
"""
import mmap

import torch

# below this size a buffer is cheaper on glibc's heap than as a mapping of its own (the
# glibc default mmap threshold is 128 KiB; one page-fault per 4 KiB either way)
MIN_UNHEAPED_BYTES = 4 << 20


def transient_empty(numel: int, dtype: torch.dtype, device) -> torch.Tensor:
    """``torch.empty(numel, dtype=dtype, device=device)``; a host buffer of at least
    ``MIN_UNHEAPED_BYTES`` lives in its own anonymous mapping (see the module docstring)."""
    device = torch.device(device)
    nbytes = numel * dtype.itemsize
    if device.type != "cpu" or nbytes < MIN_UNHEAPED_BYTES:
        return torch.empty(numel, dtype=dtype, device=device)
    mapping = mmap.mmap(-1, nbytes)  # anonymous, private, zero-filled on first touch
    return torch.frombuffer(mapping, dtype=torch.uint8, count=nbytes).view(dtype)
