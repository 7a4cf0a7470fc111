"""Sign bit-packing: 8 signs per byte, the wire format of every 1-bit backend.

A sign bit is 1 for ``x >= 0`` and 0 for ``x < 0`` (``sign⁺``: zero counts as positive, so a
compressed value is never 0; that is why the momentum mask exists). Bits are packed big-endian
within a byte, as ``numpy.packbits`` does, so the CPU torch kernel and the optional cupy kernel
produce the same bytes and ranks using different kernels can still talk to each other.

The torch kernel is a handful of elementwise ops (compare, shift, sum over 8 lanes), so it runs on
any device torch runs on; cupy's ``packbits`` is used for CUDA tensors when cupy is installed,
because it is one fused kernel instead of four launches.
"""
import torch

_SHIFTS = {}


def _shifts(device):
    shifts = _SHIFTS.get(device)
    if shifts is None:
        shifts = torch.arange(7, -1, -1, dtype=torch.uint8, device=device)
        _SHIFTS[device] = shifts
    return shifts


def _cupy():
    try:
        import cupy
    except ImportError:
        return None
    return cupy


def pack_signs(x):
    """``x`` (a float tensor whose last dimension is a multiple of 8) -> uint8 tensor with the last
    dimension divided by 8, bit ``7 - i % 8`` of byte ``i // 8`` set when ``x[..., i] >= 0``."""
    if x.shape[-1] % 8:
        raise ValueError(f"pack_signs needs the last dimension to be a multiple of 8, got "
                         f"shape {tuple(x.shape)}")
    if x.is_cuda:
        cupy = _cupy()
        if cupy is not None:
            bits = cupy.from_dlpack((x >= 0).contiguous())
            packed = cupy.packbits(bits.reshape(-1))
            return torch.from_dlpack(packed).view(*x.shape[:-1], x.shape[-1] // 8)
    bits = (x >= 0).to(torch.uint8).view(*x.shape[:-1], x.shape[-1] // 8, 8)
    return (bits << _shifts(x.device)).sum(dim=-1, dtype=torch.uint8)


def unpack_signs(packed, dtype=torch.float32):
    """The inverse of ``pack_signs``: uint8 ``(..., m)`` -> ``(..., 8m)`` of +1.0 / -1.0."""
    bits = (packed.unsqueeze(-1) >> _shifts(packed.device)) & 1
    signs = bits.to(dtype).mul_(2).sub_(1)
    return signs.view(*packed.shape[:-1], packed.shape[-1] * 8)


def sign_plus(x):
    """``+1`` where ``x >= 0``, ``-1`` elsewhere (the values ``pack_signs`` encodes)."""
    return torch.where(x >= 0, 1.0, -1.0).to(x.dtype)
