"""``DS4Sci_EvoformerAttention(Q, K, V, biases)``: Evoformer's attention without the full
attention matrix.

``Q``: ``[B, N, Lq, H, D]``, ``K``/``V``: ``[B, N, Lk, H, D]`` (N = MSA rows, or residues for the
column-wise and triangular variants); ``biases``: a list of at most two 5-D tensors, each
broadcastable to the score shape ``[B, N, H, Lq, Lk]`` (every dimension 1 or full), e.g. the
documented ``res_mask [B, N, 1, 1, Lk]`` and ``pair_bias [B, 1, H, Lq, Lk]``. Returns
``softmax(Q K^T / sqrt(D) + sum(biases)) V`` in Q's layout; gradients flow to Q, K, V and to every
bias that requires them (summed over the dimensions it broadcasts over).

CUDA tensors run the Triton kernels (``triton_kernels.py``, a flash-attention-style forward and
backward), everything else the chunked torch path (``chunked.py``). The docs ask for fp16/bf16
inputs (the CUDA kernels' types); fp32 is accepted too, on both paths.
"""
import importlib

import torch

from deepspeed.ops.deepspeed4science.chunked import ChunkedEvoformerAttention
from deepspeed.ops.triton_support import use_triton

BACKEND_ENV = "DS_EVOFORMER_BACKEND"
DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def _check(q, k, v, biases):
    names = ("Q", "K", "V")
    for name, t in zip(names, (q, k, v)):
        if not isinstance(t, torch.Tensor) or t.dim() != 5:
            raise ValueError(f"DS4Sci_EvoformerAttention: {name} must be a 5-D tensor [batch, rows, "
                             f"seq, heads, head_dim], got "
                             f"{tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__}")
        if t.dtype not in DTYPES:
            raise ValueError(f"DS4Sci_EvoformerAttention: {name} has dtype {t.dtype}; allowed: "
                             f"float16, bfloat16 (the documented types) or float32")
    if not (q.dtype == k.dtype == v.dtype) or not (q.device == k.device == v.device):
        raise ValueError(f"DS4Sci_EvoformerAttention: Q, K, V must share dtype and device, got "
                         f"{[(t.dtype, str(t.device)) for t in (q, k, v)]}")
    if k.shape != v.shape or k.shape[:2] != q.shape[:2] or k.shape[3:] != q.shape[3:]:
        raise ValueError(f"DS4Sci_EvoformerAttention: K and V must be [batch, rows, Lk, heads, "
                         f"head_dim] matching Q {tuple(q.shape)} except Lk, got K {tuple(k.shape)}, "
                         f"V {tuple(v.shape)}")
    if not isinstance(biases, (list, tuple)) or len(biases) > 2:
        raise ValueError(f"DS4Sci_EvoformerAttention: biases must be a list of at most 2 tensors "
                         f"(e.g. [res_mask, pair_bias]), got {type(biases).__name__} of "
                         f"length {len(biases) if isinstance(biases, (list, tuple)) else '?'}")
    b, n, lq, h, _ = q.shape
    full = (b, n, h, lq, k.shape[2])
    for i, bias in enumerate(biases):
        if bias is None:
            continue
        shape = tuple(bias.shape) if isinstance(bias, torch.Tensor) else None
        if shape is None or len(shape) != 5 or any(s not in (1, f) for s, f in zip(shape, full)):
            raise ValueError(f"DS4Sci_EvoformerAttention: bias {i} must be 5-D and broadcastable to "
                             f"[batch, rows, heads, Lq, Lk] = {list(full)} (each dimension 1 or "
                             f"full, e.g. [{b}, {n}, 1, 1, {full[4]}] or [{b}, 1, {h}, {lq}, "
                             f"{full[4]}]), got {shape if shape is not None else type(bias).__name__}")
        if bias.dtype not in DTYPES or bias.device != q.device:
            raise ValueError(f"DS4Sci_EvoformerAttention: bias {i} must be a float tensor on "
                             f"{q.device}, got {bias.dtype} on {bias.device}")


def DS4Sci_EvoformerAttention(Q, K, V, biases, backend=None):
    """Evoformer attention; ``backend``: None ($DS_EVOFORMER_BACKEND, else auto), ``auto``,
    ``torch`` or ``triton``."""
    _check(Q, K, V, biases)
    bias1, bias2 = (list(biases) + [None, None])[:2]
    q, k, v = (t.transpose(2, 3) for t in (Q, K, V))  # [B, N, H, L, D] views
    if use_triton(Q, backend, BACKEND_ENV, "DS4Sci_EvoformerAttention"):
        kernels = importlib.import_module("deepspeed.ops.deepspeed4science.triton_kernels")
        out = kernels.TritonEvoformerAttention.apply(q, k, v, bias1, bias2)
    elif Q.dtype == torch.float16 and Q.device.type == "cpu":  # no fp16 arithmetic on CPU
        out = ChunkedEvoformerAttention.apply(q.float(), k.float(), v.float(), bias1, bias2, None).half()
    else:
        out = ChunkedEvoformerAttention.apply(q, k, v, bias1, bias2, None)
    return out.transpose(2, 3)


def evoformer_attention_reference(Q, K, V, biases):
    """The naive form (full score matrix), for tests and benchmarks: ``[B, N, Lq, H, D]``."""
    q, k, v = (t.transpose(2, 3) for t in (Q, K, V))
    s = (q @ k.transpose(-1, -2)) * (Q.shape[-1] ** -0.5)
    for bias in biases:
        if bias is not None:
            s = s + bias
    return (torch.softmax(s, dim=-1) @ v).transpose(2, 3)
