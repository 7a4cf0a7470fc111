"""Quantizers against a per-group reference written here, stochastic rounding's bias, and the
straight-through gradient."""
import pytest
import torch

from deepspeed.compression.quantizers import (asymmetric_quantize, binary_quantize, quantize,
                                              quantize_activation, quantize_tensor,
                                              symmetric_quantize, ternary_quantize)


def reference_symmetric(x, bits, groups):
    out = torch.empty_like(x).reshape(groups, -1)
    for g, row in enumerate(x.reshape(groups, -1)):
        scale = 2 * row.abs().max().item() / 2 ** bits
        for i, value in enumerate(row.tolist()):
            level = min(max(round(value / scale), -2 ** (bits - 1)), 2 ** (bits - 1) - 1)
            out[g, i] = level * scale
    return out.reshape(x.shape)


def reference_asymmetric(x, bits, groups):
    out = torch.empty_like(x).reshape(groups, -1)
    for g, row in enumerate(x.reshape(groups, -1)):
        low, high = row.min().item(), row.max().item()
        scale = (high - low) / 2 ** bits
        zero = round(low / scale) * scale
        for i, value in enumerate(row.tolist()):
            out[g, i] = min(max(round((value - zero) / scale), 0), 2 ** bits - 1) * scale + zero
    return out.reshape(x.shape)


@pytest.mark.parametrize("bits", [3, 4, 8])
@pytest.mark.parametrize("groups", [1, 4])
def test_symmetric_matches_reference_per_group(bits, groups):
    x = torch.randn(8, 6, generator=torch.Generator().manual_seed(bits + groups)) * \
        torch.arange(1, 9).reshape(8, 1)  # groups with very different ranges
    q = symmetric_quantize(x.double(), bits, groups)
    torch.testing.assert_close(q, reference_symmetric(x.double(), bits, groups))
    for row in q.reshape(groups, -1):
        assert row.unique().numel() <= 2 ** bits


@pytest.mark.parametrize("bits", [3, 4, 8])
@pytest.mark.parametrize("groups", [1, 4])
def test_asymmetric_matches_reference_and_error_bound(bits, groups):
    x = torch.rand(8, 6, generator=torch.Generator().manual_seed(bits)).double() * 3 + 1
    q = asymmetric_quantize(x, bits, groups)
    torch.testing.assert_close(q, reference_asymmetric(x, bits, groups))
    for row_q, row_x in zip(q.reshape(groups, -1), x.reshape(groups, -1)):
        assert row_q.unique().numel() <= 2 ** bits
        step = (row_x.max() - row_x.min()) / 2 ** bits
        # rounding error half a step, plus one step where the top value is clamped
        assert (row_q - row_x).abs().max() <= step * 1.5 + 1e-9


def test_groups_get_their_own_scale():
    x = torch.cat([torch.full((4,), 0.01), torch.full((4,), 100.0)]) * torch.tensor([1, -1] * 4)
    one = symmetric_quantize(x, 4, 1)
    two = symmetric_quantize(x, 4, 2)
    assert (one[:4] == 0).all()  # the small group vanishes under the big group's scale
    torch.testing.assert_close(two, x, atol=0.01, rtol=0.2)


@pytest.mark.parametrize("quantizer", [symmetric_quantize, asymmetric_quantize])
def test_stochastic_rounding_is_unbiased(quantizer):
    torch.manual_seed(0)
    x = torch.linspace(-1, 1, 37)
    draws = torch.stack([quantizer(x, 3, 1, "stochastic") for _ in range(10000)])
    nearest = quantizer(x, 3, 1, "nearest")
    # values beyond the grid's ends are clamped (symmetric's top level is 2^(b-1)-1 steps)
    interior = (x >= nearest.min()) & (x <= nearest.max())
    assert interior.sum() > 25
    step = 2 / 2 ** 3
    assert (draws.mean(0) - x)[interior].abs().max() < 0.05 * step
    assert (nearest - x)[interior].abs().max() > 0.2 * step  # nearest is biased for some x
    assert draws.unique().numel() > nearest.unique().numel() - 1


def test_ternary_and_binary_values():
    x = torch.randn(4, 32, generator=torch.Generator().manual_seed(3))
    t = ternary_quantize(x, 4)
    b = binary_quantize(x, 4)
    for row_t, row_b, row_x in zip(t.reshape(4, -1), b.reshape(4, -1), x.reshape(4, -1)):
        assert row_t.unique().numel() == 3 and 0 in row_t.unique().tolist()
        assert row_b.unique().numel() == 2
        torch.testing.assert_close(row_b.abs(), torch.full_like(row_b, row_x.abs().mean().item()))
        threshold = 0.7 * row_x.abs().mean()
        assert ((row_t == 0) == (row_x.abs() <= threshold)).all()
    assert torch.equal(quantize_tensor(x, 2, 4), t) and torch.equal(quantize_tensor(x, 1, 4), b)


def test_straight_through_gradient():
    x = torch.randn(6, 4, requires_grad=True)
    upstream = torch.randn(6, 4)
    for bits in (1, 2, 4, 8):
        x.grad = None
        quantize(x, bits, 2).backward(upstream)
        torch.testing.assert_close(x.grad, upstream)
    x.grad = None
    quantize_activation(x, 8).backward(upstream)
    torch.testing.assert_close(x.grad, upstream)


def test_dynamic_activation_ranges_are_per_token():
    x = torch.stack([torch.linspace(-0.01, 0.01, 16), torch.linspace(-50, 50, 16)])
    q = quantize_activation(x, 8)
    # each token keeps a relative error of one 8-bit step of its own range
    for row_q, row_x in zip(q, x):
        assert (row_q - row_x).abs().max() <= 2 * row_x.abs().max() / 2 ** 8 + 1e-9


def test_bits_and_groups_are_checked():
    x = torch.randn(10)
    assert quantize_tensor(x, 16) is x
    with pytest.raises(ValueError, match="bits"):
        quantize_tensor(x, 0)
    with pytest.raises(ValueError, match="quantize_groups=3"):
        quantize_tensor(x, 8, 3)
