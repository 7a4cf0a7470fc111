"""Block-wise symmetric integer quantization: the arithmetic of ZeRO++'s qwZ (int8 weights),
qgZ (int4 gradients) and MixZ++ (int8 frozen weights), plus the byte packing that lets one
collective carry both the integers and their scales.

A flat tensor is cut into blocks of ``block`` elements (the last zero-padded); each block gets
one fp32 scale ``absmax / qmax`` and its elements become ``round(x / scale)`` in
``[-qmax, qmax]`` (qmax = 127 for 8 bits, 7 for 4 bits). Rounding is half away from zero, the
same in torch and in the Triton kernel, so both paths give identical integers. Dequantizing
gives back every element within ``scale / 2``.

Packed form (what travels): the integers as bytes (4-bit values two per byte, offset by 8), then
the scales' raw bytes. Every rank's packed buffer has the same length for the same element
count, which is what an ``all_gather_into_tensor`` / equal-split ``all_to_all_single`` needs.
"""
import torch

# qwZ / MixZ++ elements per scale at most (upstream aims at ~8k; small shards need finer)
WEIGHT_BLOCK = 2048
GRAD_BLOCK = 256  # qgZ elements per scale
SCALE_BYTES = 4


def fit_block(numel, target):
    """The block size for ``numel`` elements: about ``target`` (never more), a multiple of 8,
    chosen so the blocks cover ``numel`` with fewer than 8 padding elements each. A small
    shard is one block of its own size, not a mostly-empty ``target``-sized one (padding is
    bytes on the wire). Depends on ``numel`` only, so every rank (and the decoder) agrees."""
    nblocks = -(-max(numel, 1) // target)
    per = -(-max(numel, 1) // nblocks)
    return -(-per // 8) * 8


def qmax(bits):
    if bits not in (4, 8):
        raise ValueError(f"quantization supports 4 or 8 bits, got {bits}")
    return 2 ** (bits - 1) - 1


def blocks_of(numel, block):
    return -(-max(numel, 1) // block)


def packed_nbytes(numel, target, bits):
    """Bytes of the packed form of ``numel`` elements (blocks of ``fit_block(numel, target)``)."""
    block = fit_block(numel, target)
    nblocks = blocks_of(numel, block)
    return nblocks * block * bits // 8 + nblocks * SCALE_BYTES


def _use_triton(x, bits):
    if not x.is_cuda or bits != 8:
        return False
    from deepspeed.zero.zeropp import triton_quant

    return triton_quant.available()


def quantize(x, block, bits=8):
    """(q int8 of shape (nblocks, block), scales fp32 of shape (nblocks,)) for flat ``x``."""
    flat = x.reshape(-1)
    if _use_triton(flat, bits):
        from deepspeed.zero.zeropp import triton_quant

        return triton_quant.quantize(flat, block)
    nblocks = blocks_of(flat.numel(), block)
    padded = torch.zeros(nblocks * block, dtype=torch.float32, device=flat.device)
    padded[:flat.numel()] = flat
    rows = padded.view(nblocks, block)
    scales = rows.abs().amax(dim=1) / qmax(bits)
    # an all-zero block gets scale 1; inf / nan stay, so the block decodes to nan and an fp16
    # overflow is still seen by the loss scaler after a quantized collective
    scales = torch.where(scales == 0, torch.ones_like(scales), scales)
    y = rows / scales[:, None]
    q = (torch.sign(y) * torch.floor(y.abs() + 0.5)).clamp_(-qmax(bits), qmax(bits))
    return q.to(torch.int8), scales


def dequantize(q, scales, numel, dtype=torch.float32):
    """The flat tensor of ``numel`` elements ``quantize`` was given (within scale/2 each)."""
    if _use_triton(q, 8) and q.dtype == torch.int8:
        from deepspeed.zero.zeropp import triton_quant

        return triton_quant.dequantize(q, scales, numel, dtype)
    out = q.to(torch.float32) * scales[:, None]
    return out.reshape(-1)[:numel].to(dtype)


# ---------------------------------------------------------------------- packing
def pack(q, scales, bits):
    """One uint8 buffer: the integers (4-bit: two per byte) followed by the scales' bytes."""
    body = q.reshape(-1)
    if bits == 8:
        body = body.view(torch.uint8)
    else:
        nib = (body + 8).to(torch.uint8).view(-1, 2)
        body = (nib[:, 0] << 4) | nib[:, 1]
    return torch.cat([body, scales.to(torch.float32).contiguous().view(torch.uint8)])


def unpack(buf, nblocks, block, bits):
    """Inverse of ``pack`` for a buffer of ``nblocks`` blocks: (q, scales)."""
    body_bytes = nblocks * block * bits // 8
    body, tail = buf[:body_bytes], buf[body_bytes:body_bytes + nblocks * SCALE_BYTES]
    return _ints(body, bits).view(nblocks, block), tail.view(torch.float32)


def quantize_packed(x, target, bits=8):
    """``pack(*quantize(x))`` on blocks of ``fit_block(x.numel(), target)``: the bytes that
    travel for ``x``. The ``*_packed`` / ``*_rows`` functions all derive the block that way."""
    q, scales = quantize(x, fit_block(x.numel(), target), bits)
    return pack(q, scales, bits)


def dequantize_packed(buf, numel, target, bits=8, dtype=torch.float32):
    block = fit_block(numel, target)
    q, scales = unpack(buf, blocks_of(numel, block), block, bits)
    return dequantize(q, scales, numel, dtype)


def _ints(body, bits):
    if bits == 8:
        return body.view(torch.int8)
    high = (body >> 4).to(torch.int8) - 8
    low = (body & 0xF).to(torch.int8) - 8
    return torch.stack([high, low], dim=1).reshape(-1)


def dequantize_rows(buf, rows, numel, target, bits=8, dtype=torch.float32):
    """``buf`` holds ``rows`` packed buffers of ``numel`` elements back to back (an all-gather's
    or all-to-all's output): their values as a (rows, numel) tensor, decoded in one go."""
    block = fit_block(numel, target)
    nblocks = blocks_of(numel, block)
    view = buf.view(rows, packed_nbytes(numel, target, bits))
    body_bytes = nblocks * block * bits // 8
    q = _ints(view[:, :body_bytes].contiguous().reshape(-1), bits).view(rows * nblocks, block)
    scales = view[:, body_bytes:].contiguous().reshape(-1).view(torch.float32)
    values = dequantize(q, scales, rows * nblocks * block, dtype)
    return values.view(rows, nblocks * block)[:, :numel]
