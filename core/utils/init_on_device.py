"""``deepspeed.OnDevice`` (upstream's ``deepspeed.utils.init_on_device.OnDevice``): build a
model's tensors on a chosen device and in a chosen floating-point dtype.

    with deepspeed.OnDevice(dtype=torch.float16, device="meta"):
        model = MyModel()          # no memory: every parameter is an fp16 meta tensor
    model = model.to_empty(device="cuda")  # then load real weights

Inside the context, tensor factories (``torch.empty``, ``torch.zeros``, ``torch.randn``, ...,
which ``nn.Module`` constructors call) place their result on ``device`` unless the caller named
one, and a floating-point result whose dtype the caller did not name gets ``dtype``; integer
and bool tensors keep theirs. It is a ``TorchFunctionMode``, active for this thread inside the
``with`` block only: torch itself is never patched.
"""
import torch
from torch.overrides import TorchFunctionMode

# public factories whose result is new storage and whose ``device`` / ``dtype`` a caller may
# leave to the defaults (``*_like`` follow their input and are left alone)
_FACTORIES = frozenset([
    torch.empty, torch.empty_strided, torch.zeros, torch.ones, torch.full, torch.rand,
    torch.randn, torch.randint, torch.randperm, torch.arange, torch.range, torch.linspace,
    torch.logspace, torch.eye, torch.tensor, torch.as_tensor, torch.normal,
])


class OnDevice(TorchFunctionMode):
    """Create tensors on ``device`` with floating-point ``dtype`` (see the module docstring);
    ``enabled=False`` makes the context do nothing, so call sites need no branch."""

    def __init__(self, dtype, device="meta", enabled=True):
        super().__init__()
        if dtype is not None and not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
            raise ValueError(f"OnDevice(dtype=...) must be a floating-point torch.dtype or None, "
                             f"got {dtype!r}")
        self.dtype = dtype
        self.device = torch.device(device)
        self.enabled = enabled

    def __enter__(self):
        return super().__enter__() if self.enabled else self

    def __exit__(self, exc_type, exc_value, traceback):
        if self.enabled:
            return super().__exit__(exc_type, exc_value, traceback)
        return None

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if func not in _FACTORIES or kwargs.get("out") is not None:
            return func(*args, **kwargs)
        if kwargs.get("device") is None and not (func is torch.as_tensor and args
                                                 and torch.is_tensor(args[0])):
            kwargs["device"] = self.device
        chose_dtype = kwargs.get("dtype") is not None
        result = func(*args, **kwargs)
        if (not chose_dtype and self.dtype is not None and torch.is_tensor(result)
                and result.is_floating_point() and result.dtype != self.dtype):
            result = result.to(self.dtype)
        return result


__all__ = ["OnDevice"]
