"""sequence_tiled_compute and TiledFusedLogitsLoss equal their untiled computations."""
import pytest
import torch
import torch.nn.functional as F

from deepspeed.runtime.sequence_parallel.ulysses_sp import (TiledFusedLogitsLoss,
                                                             sequence_tiled_compute)

B, S, H, V = 2, 13, 8, 11


class _Head(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lm_head = torch.nn.Linear(H, V, bias=False)

    def sum_loss(self, hidden_states, shift_labels):
        logits = self.lm_head(hidden_states)
        return F.cross_entropy(logits.reshape(-1, V), shift_labels.reshape(-1), ignore_index=-100,
                               reduction="sum")


def _data(seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    head = _Head().to(dtype)
    hidden = torch.randn(B, S, H, generator=g, dtype=dtype, requires_grad=True)
    labels = torch.randint(0, V, (B, S), generator=g)
    labels[0, :3] = -100  # an SFT prompt
    # the adapter's pre-shifted labels: next token, -100 at the end
    shift_labels = F.pad(labels[:, 1:], (0, 1), value=-100)
    return head, hidden, labels, shift_labels


def _untiled_hf_loss(head, hidden, labels):
    """The usual causal-LM loss: full logits, shifted inside, mean over non-ignored labels."""
    logits = head.lm_head(hidden)
    return F.cross_entropy(logits[:, :-1].reshape(-1, V), labels[:, 1:].reshape(-1),
                           ignore_index=-100)


def _grads(head, hidden):
    return [hidden.grad] + [p.grad for p in head.parameters()]


@pytest.mark.parametrize("shards", [1, 3, 4, 13, 16])
def test_tiled_fused_logits_loss_sum_matches_untiled_shifted_loss(shards):
    head, hidden, labels, shift_labels = _data()
    ref = _untiled_hf_loss(head, hidden, labels)
    ref.backward()
    ref_grads = [g.clone() for g in _grads(head, hidden)]
    head2, hidden2, _, shift2 = _data()
    total = TiledFusedLogitsLoss.apply(lambda self, x, y: self.sum_loss(x, y), head2, hidden2,
                                       shift2, None, shards, [head2.lm_head.weight], "sum")
    loss = total / (shift2 != -100).sum()
    (loss * 3.0).backward()  # an incoming gradient != 1 (loss scaling) is honoured
    torch.testing.assert_close(loss, ref, rtol=1e-12, atol=1e-12)
    for mine, want in zip(_grads(head2, hidden2), ref_grads):
        torch.testing.assert_close(mine, 3.0 * want, rtol=1e-12, atol=1e-12)


def test_tiled_fused_logits_loss_mean_with_mask_on_even_shards():
    g = torch.Generator().manual_seed(3)
    head = _Head().double()
    hidden = torch.randn(1, 12, H, generator=g, dtype=torch.float64, requires_grad=True)
    y = torch.randint(0, V, (1, 12), generator=g)
    mask = torch.ones(1, 12)

    def fn(self, x, y, m):
        per_tok = F.cross_entropy(self.lm_head(x).reshape(-1, V), y.reshape(-1), reduction="none")
        return (per_tok * m.reshape(-1)).mean()

    ref = fn(head, hidden, y, mask)
    ref.backward()
    ref_grads = [g.clone() for g in _grads(head, hidden)]
    hidden.grad = None
    head.zero_grad(set_to_none=True)
    loss = TiledFusedLogitsLoss.apply(fn, head, hidden, y, mask, 3, None, "mean")
    loss.backward()
    torch.testing.assert_close(loss, ref, rtol=1e-12, atol=1e-12)
    for mine, want in zip(_grads(head, hidden), ref_grads):
        torch.testing.assert_close(mine, want, rtol=1e-12, atol=1e-12)


def test_tiled_fused_logits_loss_bad_arguments():
    head, hidden, _, shift = _data()
    with pytest.raises(ValueError, match="output_reduction"):
        TiledFusedLogitsLoss.apply(None, head, hidden, shift, None, 2, None, "max")
    with pytest.raises(ValueError, match=r"\(2, 12\)"):
        TiledFusedLogitsLoss.apply(None, head, hidden, shift[:, :12], None, 2, None, "sum")


@pytest.mark.parametrize("shards", [1, 4, 5])
def test_sequence_tiled_compute_unsharded_output_matches(shards):
    """output_reduction=None: per-token outputs concatenated back along the sequence."""
    head, hidden, _, _ = _data(1)
    scale = torch.tensor(0.5, dtype=torch.float64)
    w = torch.randn(B, S, V, dtype=torch.float64)

    def fn(hidden_states, scale):
        return torch.tanh(head.lm_head(hidden_states)) * scale

    ref = fn(hidden, scale)
    (ref * w).sum().backward()
    ref_grads = [g.clone() for g in _grads(head, hidden)]
    hidden.grad = None
    head.zero_grad(set_to_none=True)
    out = sequence_tiled_compute(fn, S, shards, {"hidden_states": hidden}, {"scale": scale},
                                 "hidden_states", compute_params=[head.lm_head.weight],
                                 output_unshard_dimension=1, output_reduction=None)
    (out * w).sum().backward()
    torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-12)
    for mine, want in zip(_grads(head, hidden), ref_grads):
        torch.testing.assert_close(mine, want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("reduction", ["sum", "mean"])
def test_sequence_tiled_compute_loss_reduction_matches(reduction):
    head, hidden, labels, shift_labels = _data(2)
    shards = 4 if reduction == "sum" else 1  # "mean" is exact for equal shards: use one
    ref = head.sum_loss(hidden, shift_labels)
    ref.backward()
    ref_grads = [g.clone() for g in _grads(head, hidden)]
    hidden.grad = None
    head.zero_grad(set_to_none=True)
    out = sequence_tiled_compute(head.sum_loss, S, shards,
                                 {"hidden_states": hidden, "shift_labels": shift_labels}, {},
                                 "hidden_states", compute_params=[head.lm_head.weight],
                                 output_reduction=reduction)
    out.backward()
    torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-12)
    for mine, want in zip(_grads(head, hidden), ref_grads):
        torch.testing.assert_close(mine, want, rtol=1e-12, atol=1e-12)


def test_sequence_tiled_compute_mean_of_equal_shards():
    head, hidden, _, _ = _data(4)
    hidden = hidden[:, :12].detach().requires_grad_()

    def fn(x):
        return head.lm_head(x).square().mean()

    ref = fn(hidden)
    ref.backward()
    ref_grads = [g.clone() for g in _grads(head, hidden)]
    hidden.grad = None
    head.zero_grad(set_to_none=True)
    out = sequence_tiled_compute(fn, 12, 3, {"x": hidden}, None, "x",
                                 compute_params=[head.lm_head.weight], output_reduction="mean")
    out.backward()
    torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-12)
    for mine, want in zip(_grads(head, hidden), ref_grads):
        torch.testing.assert_close(mine, want, rtol=1e-12, atol=1e-12)


def test_sequence_tiled_compute_bad_arguments():
    head, hidden, _, _ = _data()
    with pytest.raises(ValueError, match="seqlen=12"):
        sequence_tiled_compute(head.lm_head, 12, 2, {"x": hidden}, {}, "x")
    with pytest.raises(ValueError, match="'y'"):
        sequence_tiled_compute(head.lm_head, S, 2, {"x": hidden}, {}, "y")
    with pytest.raises(ValueError, match="'max'"):
        sequence_tiled_compute(head.lm_head, S, 2, {"x": hidden}, {}, "x", output_reduction="max")
    with pytest.raises(ValueError, match="got 0"):
        sequence_tiled_compute(head.lm_head, S, 0, {"x": hidden}, {}, "x")
