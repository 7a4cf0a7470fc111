"""Domino on 2 gloo ranks (TP 2, the batch in 2 pieces, asynchronous all-reduces; with and
without the row-parallel outputs also cut in 2 hidden pieces) computes what tensor parallelism
without overlap computes: forward loss, every gradient and 3 AdamW steps' losses are bit for bit
those of the same schedule with blocking all-reduces (``overlap=False``); the forward loss is
bit for bit that of plain whole-batch TP (one piece, blocking), whose gradients and training
losses it equals to 1e-5 (fp32: a weight gradient summed over two half batches rounds
differently), as it equals the unsplit single-process reference model."""
import pytest
import torch

from deepspeed.testing import run_distributed

STEPS, LR, TOL = 3, 1e-2, 1e-5


def _forward_backward(model, ids):
    loss = model(ids)
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


def _train(model, steps):
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
    optimizer.zero_grad()
    losses = []
    for ids in steps:
        loss = model(ids)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses


def _compare_on_two_ranks(hidden_chunks):
    from deepspeed.utils import groups
    from domino_helpers import batches, domino_gpt, rank_slice, reference_gpt

    previous = groups.mpu
    try:
        groups.init_tensor_parallel_groups(2)
        reference = reference_gpt()
        ids = batches(1)[0]
        ref_loss, ref_grads = _forward_backward(reference, ids)

        domino = domino_gpt(reference, hidden_chunks=hidden_chunks)
        blocking = domino_gpt(reference, overlap=False, hidden_chunks=hidden_chunks)  # blocking
        plain_tp = domino_gpt(reference, num_chunks=1, overlap=False)  # no split, no overlap
        assert domino.transformer.layers[0].self_attention.query_key_value.weight.shape == (48, 32)
        loss, grads = _forward_backward(domino, ids)
        blocking_loss, blocking_grads = _forward_backward(blocking, ids)
        tp_loss, tp_grads = _forward_backward(plain_tp, ids)

        assert torch.equal(loss, blocking_loss)
        assert torch.equal(loss, tp_loss)  # the batch rows (and output features) never mix
        torch.testing.assert_close(loss, ref_loss, atol=TOL, rtol=TOL)
        assert grads.keys() == ref_grads.keys()
        for name, grad in grads.items():
            assert torch.equal(grad, blocking_grads[name]), name
            torch.testing.assert_close(grad, tp_grads[name], atol=TOL, rtol=TOL)
            torch.testing.assert_close(grad, rank_slice(domino, name, ref_grads[name]),
                                       atol=TOL, rtol=TOL)

        steps = batches(STEPS)
        losses = _train(domino_gpt(reference, hidden_chunks=hidden_chunks), steps)
        assert losses == _train(domino_gpt(reference, overlap=False, hidden_chunks=hidden_chunks),
                                steps)
        torch.testing.assert_close(torch.tensor(losses), torch.tensor(_train(domino_gpt(reference, 1, False), steps)),
                                   atol=TOL, rtol=TOL)
        ref_losses = _train(reference, steps)
        torch.testing.assert_close(torch.tensor(losses), torch.tensor(ref_losses), atol=TOL, rtol=TOL)
        assert losses[-1] < losses[0]
        return losses
    finally:
        groups.set_mpu(previous)


@pytest.mark.parametrize("hidden_chunks", [1, 2])
def test_domino_equals_non_overlapped_tensor_parallelism(hidden_chunks):
    losses = run_distributed(_compare_on_two_ranks, world_size=2, args=(hidden_chunks,),
                             timeout=600)
    assert losses[0] == losses[1]  # both tensor-parallel ranks see the whole loss
