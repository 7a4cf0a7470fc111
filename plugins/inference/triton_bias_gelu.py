"""The Triton kernel of ``FusedBiasGeLU``: ``gelu(y + bias)`` in one pass over ``y``.

Imported only when a CUDA tensor reaches it (or under ``TRITON_INTERPRET=1`` for the CPU
check). Computes in fp32 and stores in ``y``'s dtype; exact GeLU uses ``erf``, the tanh form
uses ``tanh(z) = 2 * sigmoid(2z) - 1``."""
import torch
import triton
import triton.language as tl


@triton.jit
def _bias_gelu_kernel(y_ptr, b_ptr, out_ptr, n, cols, BLOCK: tl.constexpr, TANH: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    y = tl.load(y_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    b = tl.load(b_ptr + offs % cols, mask=mask, other=0.0).to(tl.float32)
    x = y + b
    if TANH:
        inner = 0.7978845608028654 * (x + 0.044715 * x * x * x)
        g = 0.5 * x * (2.0 * tl.sigmoid(2.0 * inner))
    else:
        g = 0.5 * x * (1.0 + tl.math.erf(x * 0.7071067811865476))
    tl.store(out_ptr + offs, g.to(out_ptr.dtype.element_ty), mask=mask)


def triton_bias_gelu(y, bias, tanh=False, block=1024):
    y = y.contiguous()
    out = torch.empty_like(y)
    n = y.numel()
    _bias_gelu_kernel[(triton.cdiv(n, block),)](y, bias.contiguous(), out, n, y.shape[-1],
                                                BLOCK=block, TANH=tanh)
    return out
