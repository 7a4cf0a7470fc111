"""Shared cases for the Evoformer attention tests: the documented shape variants with both
biases, and the comparison of an implementation against the naive reference computed in fp32
from the same inputs (forward, and grads of Q, K, V and both biases)."""
import torch

from deepspeed.ops.deepspeed4science import DS4Sci_EvoformerAttention, evoformer_attention_reference

TOL = {torch.float32: 1e-5, torch.bfloat16: 2e-2, torch.float16: 2e-3}


def variant(name, b=1, n_seq=3, n_res=20, heads=2, dim=8):
    """(Q, K, V, [bias1, bias2]) of one documented attention variant (fp32 leaves)."""
    shapes = {
        # MSA row-wise: Q/K/V [B, N_seq, N_res, H, D], res_mask [B, N_seq, 1, 1, N_res],
        # pair_bias [B, 1, H, N_res, N_res]
        "row": ((b, n_seq, n_res, heads, dim), (b, n_seq, 1, 1, n_res), (b, 1, heads, n_res, n_res)),
        # MSA column-wise: Q/K/V [B, N_res, N_seq, H, D], mask [B, N_res, 1, 1, N_seq]
        "column": ((b, n_res, n_seq, heads, dim), (b, n_res, 1, 1, n_seq), None),
        # triangular (starting node): Q/K/V [B, N_res, N_res, H, D], mask [B, N_res, 1, 1, N_res],
        # right edges [B, 1, H, N_res, N_res]
        "triangle": ((b, n_res, n_res, heads, dim), (b, n_res, 1, 1, n_res), (b, 1, heads, n_res, n_res)),
    }[name]
    gen = torch.Generator().manual_seed(0)
    qkv = [torch.randn(shapes[0], generator=gen) for _ in range(3)]
    mask = (torch.rand(shapes[1], generator=gen) > 0.2).float()
    biases = [1e9 * (mask - 1)]  # the tests' additive form of a 0/1 mask
    if shapes[2] is not None:
        biases.append(torch.randn(shapes[2], generator=gen))
    return qkv, biases


def compare(name, dtype, device="cpu", backend=None, bias_grad=True, **shape):
    """Max abs differences (forward, dQ, dK, dV, dbias...) are within TOL[dtype]; raises if not.
    ``shape``: ``variant``'s sizes, where a caller needs other than the defaults."""
    (q, k, v), biases = variant(name, **shape)
    leaves = [t.to(device, dtype).requires_grad_() for t in (q, k, v)]
    bias_leaves = [b.to(device, dtype).requires_grad_(bias_grad and i == len(biases) - 1)
                   for i, b in enumerate(biases)]
    out = DS4Sci_EvoformerAttention(*leaves, bias_leaves, backend=backend)
    ref_leaves = [t.detach().float().requires_grad_(t.requires_grad) for t in leaves + bias_leaves]
    ref = evoformer_attention_reference(*ref_leaves[:3], ref_leaves[3:])
    grad = torch.randn(out.shape, generator=torch.Generator().manual_seed(1)).to(device)
    wants = [t for t in ref_leaves if t.requires_grad]
    got = torch.autograd.grad(out, [t for t in leaves + bias_leaves if t.requires_grad], grad.to(dtype))
    want = torch.autograd.grad(ref, wants, grad)
    tol = TOL[dtype]
    assert out.dtype == dtype and out.shape == q.shape
    torch.testing.assert_close(out.float(), ref.detach(), rtol=tol, atol=tol)
    for i, (g, w) in enumerate(zip(got, want)):
        scale = max(1.0, w.abs().max().item())  # bias grads sum over rows: relative to their size
        torch.testing.assert_close(g.float(), w, rtol=tol, atol=tol * scale, msg=f"grad {i} of {name}")
