"""`deepspeed.checkpointing.checkpoint` against the same computation without checkpointing."""
import pytest
import torch

import deepspeed.checkpointing as ckpt
from tiny_models import mlp



class Block(torch.nn.Module):
    def __init__(self, width):
        super().__init__()
        self.fc1 = torch.nn.Linear(width, 2 * width)
        self.fc2 = torch.nn.Linear(2 * width, width)
        self.dropout = torch.nn.Dropout(p=0.5)


def segment(block, hidden, scale, use_dropout, calls):
    """Non-tensor arguments (a module, a float, a bool, a list) and mixed outputs."""
    calls.append(1)
    h = torch.relu(block.fc1(hidden)) * scale
    if use_dropout:
        h = block.dropout(h)
    out = block.fc2(h) + hidden
    aux = h.mean(dim=-1)
    return out, aux, "tag", torch.tensor([len(calls)])


def _run(blocks, x0, use_checkpoint, calls):
    for block in blocks:
        block.zero_grad(set_to_none=True)
    torch.manual_seed(1234)
    x = x0.clone().requires_grad_()
    hidden, aux_total = x, 0
    for i, block in enumerate(blocks):
        args = (block, hidden, 0.5 * (i + 1), i % 2 == 0, calls)
        outputs = ckpt.checkpoint(segment, *args) if use_checkpoint else segment(*args)
        hidden, aux, tag, counter = outputs
        assert tag == "tag" and counter.dtype == torch.int64 and not counter.requires_grad
        aux_total = aux_total + aux.sum()
    loss = hidden.pow(2).sum() + aux_total
    loss.backward()
    grads = [p.grad.clone() for block in blocks for p in block.parameters()]
    return hidden.detach(), x.grad.clone(), grads, torch.get_rng_state()


@pytest.fixture
def blocks():
    torch.manual_seed(0)
    return [Block(8).train() for _ in range(3)]


def test_gradients_equal_the_unchecked_run_exactly(blocks):
    x0 = torch.randn(4, 8)
    ref_calls, calls = [], []
    ref = _run(blocks, x0, False, ref_calls)
    got = _run(blocks, x0, True, calls)

    assert torch.equal(got[0], ref[0])  # outputs
    assert torch.equal(got[1], ref[1])  # input gradient
    assert len(got[2]) == len(ref[2]) == 12
    for g, r in zip(got[2], ref[2]):
        assert torch.equal(g, r)
    # the recompute replayed the dropout masks and then put the RNG back where forward left it
    assert torch.equal(got[3], ref[3])
    assert len(ref_calls) == 3 and len(calls) == 6  # every segment ran again in backward


def test_dropout_actually_drops(blocks):
    """Guard for the test above: with dropout on, different seeds give different outputs, so
    equal gradients really do need the replayed RNG state."""
    x = torch.randn(4, 8)
    torch.manual_seed(1)
    a = segment(blocks[0], x, 1.0, True, [])[0]
    torch.manual_seed(2)
    b = segment(blocks[0], x, 1.0, True, [])[0]
    assert not torch.equal(a, b)


def test_parameters_get_gradients_when_no_input_requires_grad():
    torch.manual_seed(0)
    layer = torch.nn.Sequential(torch.nn.Linear(6, 6), torch.nn.Dropout(0.3), torch.nn.Tanh())
    x = torch.randn(3, 6)

    torch.manual_seed(5)
    layer(x).sum().backward()
    ref = [p.grad.clone() for p in layer.parameters()]
    layer.zero_grad(set_to_none=True)

    torch.manual_seed(5)
    out = ckpt.checkpoint(layer, x)
    assert out.requires_grad
    out.sum().backward()
    for p, r in zip(layer.parameters(), ref):
        assert torch.equal(p.grad, r)


def test_autograd_grad_is_rejected():
    layer = torch.nn.Linear(4, 4)
    x = torch.randn(2, 4, requires_grad=True)
    out = ckpt.checkpoint(layer, x)
    with pytest.raises(RuntimeError, match=r"Checkpointing is not compatible with \.grad\(\)"):
        torch.autograd.grad(out.sum(), x)


def test_no_grad_runs_the_function_once_and_keeps_nothing():
    calls = []

    def fn(x):
        calls.append(1)
        return [x * 2, x + 1]

    x = torch.randn(3)
    with torch.no_grad():
        out = ckpt.checkpoint(fn, x)
    assert isinstance(out, tuple) and torch.equal(out[0], x * 2) and torch.equal(out[1], x + 1)
    assert len(calls) == 1


def test_list_output_keeps_its_graph():
    x = torch.randn(3, requires_grad=True)
    out = ckpt.checkpoint(lambda t: [t * 2, t * 3], x)
    assert isinstance(out, tuple)
    (out[0].sum() + out[1].sum()).backward()
    assert torch.equal(x.grad, torch.full((3,), 5.0))


def test_nested_tensor_outputs_are_rejected():
    x = torch.randn(3, requires_grad=True)
    with pytest.raises(TypeError, match="output 1 .* nests tensors"):
        ckpt.checkpoint(lambda t: (t, [t * 2]), x)
    with pytest.raises(TypeError, match="returned a dict"):
        ckpt.checkpoint(lambda t: {"y": t}, x)


def test_non_callable_is_rejected():
    with pytest.raises(TypeError, match="expects a callable"):
        ckpt.checkpoint(torch.randn(2), torch.randn(2))


def test_unused_input_and_output_get_no_gradient():
    x = torch.randn(3, requires_grad=True)
    y = torch.randn(3, requires_grad=True)
    first, second = ckpt.checkpoint(lambda a, b: (a * 2, a * 3), x, y)
    first.sum().backward()  # `second` unused, `b` unused
    assert torch.equal(x.grad, torch.full((3,), 2.0))
    assert y.grad is None


def test_recompute_runs_under_the_forward_autocast():
    layer = mlp(8, 8, 8, activation=torch.nn.GELU)
    x0 = torch.randn(4, 8)

    def run(use_checkpoint):
        layer.zero_grad(set_to_none=True)
        x = x0.clone().requires_grad_()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = ckpt.checkpoint(layer, x) if use_checkpoint else layer(x)
        assert out.dtype == torch.bfloat16
        out.float().pow(2).sum().backward()
        return out.detach(), x.grad, [p.grad.clone() for p in layer.parameters()]

    ref, got = run(False), run(True)
    assert torch.equal(got[0], ref[0]) and torch.equal(got[1], ref[1])
    for g, r in zip(got[2], ref[2]):
        assert torch.equal(g, r)
