"""Triton kernels for int8 block quantize / dequantize (the GPU path of ``quantize.py``).

One program per block (of any size: lanes past it are masked): load the block, reduce its
absmax, write one fp32 scale and the rounded integers (half away from zero, as the torch
path). Both divisions are ``tl.math.div_rn`` (IEEE round-to-nearest, as torch's ``/``): Triton's
``/`` on fp32 compiles to the approximate ``div.full.f32`` on NVIDIA GPUs (up to 2 ulp off),
which moved quotients near a .5 tie to the other integer, so the GPU's integers differed by one
from the torch path's on some elements. Runs on CUDA tensors, and on CPU tensors under
``TRITON_INTERPRET=1`` (how the CPU test checks it against the torch path).
"""
import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - triton is optional
    triton = None


def available():
    return triton is not None


if triton is not None:

    @triton.jit
    def _block_lanes(block_size, P2: tl.constexpr):
        """This program's block index, its elements' offsets, and which lanes are inside it."""
        block = tl.program_id(0)
        lane = tl.arange(0, P2)
        return block, block * block_size + lane, lane < block_size

    @triton.jit
    def _quantize_kernel(x_ptr, q_ptr, scale_ptr, numel, block_size, P2: tl.constexpr):
        block, offs, inside = _block_lanes(block_size, P2)
        x = tl.load(x_ptr + offs, mask=inside & (offs < numel), other=0.0).to(tl.float32)
        scale = tl.math.div_rn(tl.max(tl.abs(x), axis=0), 127.0)
        # inf / nan stay (a GPU max skips nan, so it is looked for): the block decodes to nan
        # and an overflow stays visible, as on the torch path
        has_nan = tl.max((x != x).to(tl.float32), axis=0) > 0
        scale = tl.where(has_nan, float("nan"), tl.where(scale == 0, 1.0, scale))
        y = tl.math.div_rn(x, scale)
        r = tl.where(y >= 0, tl.floor(y + 0.5), -tl.floor(-y + 0.5))
        r = tl.minimum(tl.maximum(r, -127.0), 127.0)
        tl.store(q_ptr + offs, r.to(tl.int8), mask=inside)
        tl.store(scale_ptr + block, scale)

    @triton.jit
    def _dequantize_kernel(q_ptr, scale_ptr, out_ptr, numel, block_size, P2: tl.constexpr):
        block, offs, inside = _block_lanes(block_size, P2)
        q = tl.load(q_ptr + offs, mask=inside, other=0).to(tl.float32)
        scale = tl.load(scale_ptr + block)
        tl.store(out_ptr + offs, (q * scale).to(out_ptr.dtype.element_ty),
                 mask=inside & (offs < numel))

def _check():
    if triton is None:
        raise RuntimeError("the Triton quantization kernels need the 'triton' package")


def quantize(x, block):
    """(q int8 (nblocks, block), scales fp32 (nblocks,)) of flat ``x``, as ``quantize.quantize``."""
    _check()
    x = x.reshape(-1).contiguous()
    nblocks = -(-max(x.numel(), 1) // block)
    q = torch.empty(nblocks, block, dtype=torch.int8, device=x.device)
    scales = torch.empty(nblocks, dtype=torch.float32, device=x.device)
    _quantize_kernel[(nblocks,)](x, q, scales, x.numel(), block, P2=triton.next_power_of_2(block))
    return q, scales


def dequantize(q, scales, numel, dtype=torch.float32):
    _check()
    block = q.shape[-1]
    out = torch.empty(numel, dtype=dtype, device=q.device)
    _dequantize_kernel[(q.shape[0],)](q.contiguous(), scales.contiguous(), out, numel, block,
                                      P2=triton.next_power_of_2(block))
    return out
