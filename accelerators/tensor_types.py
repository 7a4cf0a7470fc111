"""Device-bound replacements for the legacy `torch.cuda.FloatTensor`-style constructors.

Those constructors are deprecated and exist only for CUDA, yet user code still calls
`get_accelerator().FloatTensor(...)` and checks `isinstance(t, get_accelerator().FloatTensor)`.
This object keeps both uses working for any device type.
"""
from __future__ import annotations

import torch


class LegacyTensorType:
    """Call like the legacy constructor: sizes give an uninitialised tensor, data gives a copy."""

    def __init__(self, dtype, device_type):
        self.dtype = dtype
        self.device_type = device_type

    def __call__(self, *args, device=None):
        device = device if device is not None else self.device_type
        if not args:
            return torch.empty(0, dtype=self.dtype, device=device)
        if len(args) == 1 and isinstance(args[0], torch.Size):
            return torch.empty(args[0], dtype=self.dtype, device=device)
        if all(isinstance(a, int) and not isinstance(a, bool) for a in args):
            return torch.empty(args, dtype=self.dtype, device=device)
        if len(args) == 1:
            return torch.as_tensor(args[0], dtype=self.dtype, device=device).clone()
        raise TypeError(f"{self!r} takes sizes (ints) or one data argument, got {args!r}")

    def __instancecheck__(self, obj):
        return isinstance(obj, torch.Tensor) and obj.dtype == self.dtype and obj.device.type == self.device_type

    def __repr__(self):
        return f"LegacyTensorType({self.dtype}, {self.device_type!r})"
