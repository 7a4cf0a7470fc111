"""MatMul (sdd / dsd / dds, transposes) and Softmax on the blocked torch path equal dense torch
computations masked by the layout, forward and backward; bad inputs fail clearly."""
import pytest
import torch

from reference import (dense_operands, dense_softmax, layout_for, to_blocks, to_dense,
                       token_mask)

from deepspeed.sparse_attention import MatMul, Softmax

TOL = {torch.float32: dict(atol=1e-5, rtol=1e-5), torch.float64: dict(atol=1e-10, rtol=1e-10),
       torch.bfloat16: dict(atol=5e-2, rtol=2e-2), torch.float16: dict(atol=5e-3, rtol=5e-3)}


def _close(got, want, dtype):
    """``TOL`` relative to the largest magnitude (a sum of k products carries k roundings)."""
    tol = dict(TOL[dtype])
    tol["atol"] *= max(1.0, float(want.detach().abs().max()))
    torch.testing.assert_close(got.double(), want.double(), **tol)


def _matmul_case(mode, trans_a, trans_b, block, dtype, backend="torch", device="cpu", z=2):
    gen = torch.Generator().manual_seed(block + 3 * trans_a + 5 * trans_b)
    h, seq, k = 2, 4 * block, 24
    layout = layout_for(h, seq, block)
    a, b, reference = dense_operands(mode, trans_a, trans_b, z, h, seq, k, layout, block, dtype, gen)
    a, b = a.to(device).requires_grad_(), b.to(device).requires_grad_()
    out = MatMul(layout, block, mode, trans_a=trans_a, trans_b=trans_b, backend=backend)(a, b)
    grad = torch.randn(out.shape, generator=gen).to(dtype)
    ga, gb = (g.cpu() for g in torch.autograd.grad(out, (a, b), grad.to(device)))
    out = out.cpu()
    # the reference runs on the host in fp64 from the same inputs (on the host: `grad` and the
    # reference's layout masks live there, and the results are compared there)
    wide = torch.float64
    a32, b32 = (t.detach().cpu().to(wide).requires_grad_() for t in (a, b))
    want = reference(a32, b32)
    ra, rb = torch.autograd.grad(want, (a32, b32), grad.to(wide))
    return (out, want), (ga, ra), (gb, rb)


@pytest.mark.parametrize("mode", ["sdd", "dsd", "dds"])
@pytest.mark.parametrize("trans_a,trans_b", [(False, False), (False, True), (True, False), (True, True)])
@pytest.mark.parametrize("block", [16, 32, 64])
def test_matmul_fp32(mode, trans_a, trans_b, block):
    for got, want in _matmul_case(mode, trans_a, trans_b, block, torch.float32):
        _close(got, want, torch.float32)


@pytest.mark.parametrize("mode", ["sdd", "dsd", "dds"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_matmul_half_precision(mode, dtype):
    for got, want in _matmul_case(mode, False, mode == "sdd", 16, dtype):
        assert got.dtype == dtype
        _close(got, want, dtype)


def _softmax_case(block, dtype, backend="torch", masks=True, device="cpu", z=2):
    gen = torch.Generator().manual_seed(block)
    h, seq = 2, 4 * block
    layout = layout_for(h, seq, block)
    x = torch.randn(z, int(layout.sum()), block, block, generator=gen).to(dtype).requires_grad_()
    rpe = torch.randn(h, seq, seq, generator=gen) if masks else None
    kp = torch.randn(z, seq, generator=gen) if masks else None
    am = torch.randn(seq, seq, generator=gen) if masks else None
    on = [t.to(device) if t is not None else None for t in (x, rpe, kp, am)]
    y = Softmax(layout, block, backend=backend)(on[0], scale=0.3, rpe=on[1], key_padding_mask=on[2],
                                                attn_mask=on[3])
    grad = torch.randn(y.shape, generator=gen).to(dtype)
    (gx,) = torch.autograd.grad(y, x, grad.to(device))
    y, gx = y.cpu(), gx.cpu()
    x32 = x.detach().float().requires_grad_()
    want = dense_softmax(to_dense(x32, layout, block), layout, block, 0.3, rpe, kp, am)
    want_blocks = to_blocks(want, layout, block)
    (rx,) = torch.autograd.grad(want_blocks, x32, grad.float())
    return (y, want_blocks), (gx, rx)


@pytest.mark.parametrize("block", [16, 32, 64])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_softmax(block, dtype):
    for got, want in _softmax_case(block, dtype):
        _close(got, want, dtype)


def test_softmax_mul_masks_drop_zeros():
    block, seq = 16, 64
    layout = layout_for(2, seq, block)
    x = torch.randn(1, int(layout.sum()), block, block)
    keep = torch.ones(1, seq)
    keep[0, 40:] = 0
    attn_keep = torch.ones(seq, seq).tril()
    y = Softmax(layout, block)(x, key_padding_mask=keep, attn_mask=attn_keep,
                               key_padding_mask_mode="mul", attn_mask_mode="mul")
    additive_kp = torch.zeros(1, seq).masked_fill(keep == 0, float("-inf"))
    additive_am = torch.zeros(seq, seq).masked_fill(attn_keep == 0, float("-inf"))
    want = dense_softmax(to_dense(x, layout, block), layout, block, 1.0, None, additive_kp, additive_am)
    _close(to_dense(y, layout, block), torch.nan_to_num(want, nan=0.0), torch.float32)


def test_a_row_masked_everywhere_gives_zeros_not_nan():
    block, seq = 16, 32
    layout = torch.ones(1, 2, 2, dtype=torch.long)
    x = torch.randn(1, 4, block, block)
    y = Softmax(layout, block)(x, key_padding_mask=torch.zeros(1, seq), key_padding_mask_mode="mul")
    assert torch.equal(y, torch.zeros_like(y))


def test_bad_inputs():
    layout = layout_for(2, 64, 16)
    with pytest.raises(NotImplementedError, match="allowed: sdd, dsd, dds"):
        MatMul(layout, 16, "ssd")
    mm = MatMul(layout, 16, "sdd", trans_b=True)
    with pytest.raises(ValueError, match="3 heads but the layout has 2"):
        mm(torch.randn(1, 3, 64, 8), torch.randn(1, 3, 64, 8))
    with pytest.raises(ValueError, match="pad_to_block_size"):
        mm(torch.randn(1, 2, 70, 8), torch.randn(1, 2, 70, 8))
    with pytest.raises(ValueError, match="sparse operand a must be"):
        MatMul(layout, 16, "dsd")(torch.randn(1, 3, 16, 16), torch.randn(1, 2, 64, 8))
    with pytest.raises(ValueError, match="block must be one of"):
        MatMul(layout, 24, "sdd")
    empty_row = torch.ones(1, 2, 2, dtype=torch.long)
    empty_row[0, 1] = 0
    with pytest.raises(ValueError, match=r"rows without any block.*\[0, 1\]"):
        Softmax(empty_row, 16)
    with pytest.raises(ValueError, match="no non-zero block"):
        Softmax(torch.zeros(1, 2, 2, dtype=torch.long), 16)
    with pytest.raises(NotImplementedError, match="allowed: add, mul"):
        Softmax(layout, 16)(torch.randn(1, int(layout.sum()), 16, 16),
                            key_padding_mask=torch.ones(1, 64), key_padding_mask_mode="or")
    with pytest.raises(ValueError, match="allowed: auto, torch, blocked, triton"):
        Softmax(layout, 16, backend="cuda")


def test_token_mask_matches_layout():
    layout = layout_for(2, 64, 16)
    assert token_mask(layout, 16).shape == (2, 64, 64)
