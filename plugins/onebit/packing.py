"""Sign bit-packing: 8 signs per byte, the wire format of every 1-bit backend.

A sign bit is 1 for ``x >= 0`` and 0 for ``x < 0`` (``sign⁺``: zero counts as positive, so a
compressed value is never 0; that is why the momentum mask exists). Bits are packed big-endian
within a byte, as ``numpy.packbits`` does, so the CPU torch kernel and the optional cupy kernel
produce the same bytes and ranks using different kernels can still talk to each other.

Kernels, all producing the same bytes:

- CPU tensors: ``numpy.packbits`` / ``numpy.unpackbits`` on a zero-copy view (one SIMD pass each;
  faster than a ``clone()`` of the fp32 input);
- CUDA tensors with cupy installed: cupy's ``packbits`` (one fused kernel);
- any other device: pure torch, no per-element loop over the 8 lanes: the 0/1 bytes of 8 signs
  are viewed as one int64 and multiplied by ``0x8040201008040201``, which moves bit ``8i`` to bit
  ``63 - i`` with no carries (all 64 partial products land on distinct bits), so the top byte
  is the packed byte; unpacking indexes a 256 x 8 table of +-1.0.
"""
import numpy
import torch

_MAGIC = 0x8040201008040201 - 2 ** 64  # as a signed int64
_TABLES = {}


def _table(device, dtype):
    """Row ``b``: the 8 signs (+1.0 / -1.0) byte ``b`` encodes, most significant bit first."""
    key = (device, dtype)
    table = _TABLES.get(key)
    if table is None:
        bits = (torch.arange(256).unsqueeze(-1) >> torch.arange(7, -1, -1)) & 1
        table = bits.to(dtype).mul_(2).sub_(1).to(device)
        _TABLES[key] = table
    return table


def _cupy():
    try:
        import cupy
    except ImportError:
        return None
    return cupy


def pack_signs(x):
    """``x`` (a float tensor whose last dimension is a multiple of 8, or a bool tensor of the signs
    already compared) -> uint8 tensor with the last dimension divided by 8, bit ``7 - i % 8`` of
    byte ``i // 8`` set when ``x[..., i] >= 0``."""
    if x.shape[-1] % 8:
        raise ValueError(f"pack_signs needs the last dimension to be a multiple of 8, got "
                         f"shape {tuple(x.shape)}")
    if x.is_cuda:
        cupy = _cupy()
        if cupy is not None:
            bits = cupy.from_dlpack((x if x.dtype == torch.bool else x >= 0).contiguous())
            packed = cupy.packbits(bits.reshape(-1))
            return torch.from_dlpack(packed).view(*x.shape[:-1], x.shape[-1] // 8)
    shape = (*x.shape[:-1], x.shape[-1] // 8)
    bits = (x if x.dtype == torch.bool else x >= 0).contiguous()
    if bits.device.type == "cpu":
        return torch.from_numpy(numpy.packbits(bits.numpy().reshape(-1))).view(shape)
    return pack_bits_torch(bits).view(shape)


def pack_bits_torch(bits):
    """The pure-torch kernel: bool tensor (numel a multiple of 8) -> flat uint8 bytes."""
    words = bits.contiguous().view(torch.uint8).view(-1, 8).view(torch.int64).view(-1)
    return words.mul(_MAGIC).bitwise_right_shift_(56).to(torch.uint8)


def unpack_signs(packed, dtype=torch.float32):
    """The inverse of ``pack_signs``: uint8 ``(..., m)`` -> ``(..., 8m)`` of +1.0 / -1.0."""
    shape = (*packed.shape[:-1], packed.shape[-1] * 8)
    if packed.device.type == "cpu" and dtype == torch.float32:
        bits = torch.from_numpy(numpy.unpackbits(packed.contiguous().numpy().reshape(-1)))
        return bits.to(dtype).mul_(2).sub_(1).view(shape)
    return unpack_signs_torch(packed, dtype).view(shape)


def unpack_signs_torch(packed, dtype=torch.float32):
    """The pure-torch kernel: uint8 bytes -> flat +-1.0 values, through a 256 x 8 table."""
    flat = packed.contiguous().view(-1).long()
    return _table(packed.device, dtype).index_select(0, flat).view(-1)


def sign_plus(x):
    """``+1`` where ``x >= 0``, ``-1`` elsewhere (the values ``pack_signs`` encodes)."""
    return torch.where(x >= 0, 1.0, -1.0).to(x.dtype)
