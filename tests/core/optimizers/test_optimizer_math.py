"""Each DeepSpeed optimizer's k steps against a float64 reference written here from the update
equations in the DeepSpeed docs (never by calling the implementation under test)."""
import math

import pytest
import torch

from deepspeed.ops.adagrad import DeepSpeedCPUAdagrad
from deepspeed.ops.adam import functional as adam_functional
from deepspeed.ops.adam import DeepSpeedCPUAdam, FusedAdam
from deepspeed.ops.lamb import FusedLamb
from deepspeed.ops.lion import DeepSpeedCPULion, FusedLion

STEPS = 5
SHAPES = [(4, 3), (5,)]
TOL = dict(rtol=1e-5, atol=1e-6)


def initial_params(scale=1.0):
    g = torch.Generator().manual_seed(0)
    return [torch.randn(s, generator=g) * scale for s in SHAPES]


def grad_sequence(steps=STEPS):
    g = torch.Generator().manual_seed(1)
    return [[torch.randn(s, generator=g) for s in SHAPES] for _ in range(steps)]


def run(make_optimizer, params, grads):
    """Step a fresh optimizer over cloned ``params`` with the fixed ``grads`` sequence."""
    tensors = [torch.nn.Parameter(p.clone()) for p in params]
    opt = make_optimizer(tensors)
    for step_grads in grads:
        for t, g in zip(tensors, step_grads):
            t.grad = g.clone()
        opt.step()
    return [t.detach() for t in tensors], opt


# ------------------------------------------------------------------ references (float64)
def ref_adam(p, grads, lr, b1, b2, eps, wd, bias_correction, decoupled):
    p = p.double()
    m, v = torch.zeros_like(p), torch.zeros_like(p)
    for t, g in enumerate(grads, start=1):
        g = g.double()
        if wd and not decoupled:
            g = g + wd * p
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g * g
        c1 = 1 - b1 ** t if bias_correction else 1.0
        c2 = 1 - b2 ** t if bias_correction else 1.0
        if wd and decoupled:
            p = p - lr * wd * p
        p = p - (lr / c1) * m / (v.sqrt() / math.sqrt(c2) + eps)
    return p


def ref_lion(p, grads, lr, b1, b2, wd):
    p, m = p.double(), torch.zeros_like(p, dtype=torch.float64)
    for g in grads:
        g = g.double()
        c = b1 * m + (1 - b1) * g
        p = p * (1 - lr * wd) - lr * torch.sign(c)
        m = b2 * m + (1 - b2) * g
    return p


def ref_adagrad(p, grads, lr, eps, wd):
    p, s = p.double(), torch.zeros_like(p, dtype=torch.float64)
    for g in grads:
        g = g.double() + wd * p
        s = s + g * g
        p = p - lr * g / (s.sqrt() + eps)
    return p


def ref_lamb(p, grads, lr, b1, b2, eps, wd, bias_correction, eps_inside_sqrt=False,
             min_coeff=0.01, max_coeff=10.0, scale=1.0):
    p = p.double()
    m, v = torch.zeros_like(p), torch.zeros_like(p)
    coeffs = []
    for t, g in enumerate(grads, start=1):
        g = g.double() / scale
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g * g
        denom = (v + eps).sqrt() if eps_inside_sqrt else v.sqrt() + eps
        u = m / denom + wd * p
        pn, un = p.norm().item(), u.norm().item()
        coeff = min(max(pn / un, min_coeff), max_coeff) if pn > 0 and un > 0 else 1.0
        step_size = lr * math.sqrt(1 - b2 ** t) / (1 - b1 ** t) if bias_correction else lr
        p = p - step_size * coeff * u
        coeffs.append(coeff)
    return p, coeffs


def per_tensor(grads, i):
    return [step[i] for step in grads]


# ------------------------------------------------------------------ Adam
@pytest.fixture(params=["torch-kernel", "foreach"])
def adam_path(request, monkeypatch):
    """Adam runs on torch's fused kernel where the device has one, else on foreach ops: check
    both paths on this machine."""
    if request.param == "foreach":
        monkeypatch.setattr(adam_functional, "fused_kernel_available", lambda device_type: False)
    return request.param


@pytest.mark.parametrize("cls", [FusedAdam, DeepSpeedCPUAdam])
@pytest.mark.parametrize("decoupled", [True, False])
@pytest.mark.parametrize("wd,bias_correction", [(0.0, True), (0.1, True), (0.1, False)])
def test_adam_matches_equations(cls, decoupled, wd, bias_correction, adam_path):
    params, grads = initial_params(), grad_sequence()
    mode = {"adam_w_mode": decoupled} if cls is FusedAdam else {"adamw_mode": decoupled}
    got, _ = run(lambda ps: cls(ps, lr=0.01, betas=(0.8, 0.99), eps=1e-6, weight_decay=wd,
                                bias_correction=bias_correction, **mode), params, grads)
    for i, p in enumerate(params):
        want = ref_adam(p, per_tensor(grads, i), 0.01, 0.8, 0.99, 1e-6, wd, bias_correction,
                        decoupled)
        torch.testing.assert_close(got[i], want.float(), **TOL)


@pytest.mark.parametrize("cls", [FusedAdam, DeepSpeedCPUAdam])
def test_adam_agrees_with_torch_adam_and_adamw(cls, adam_path):
    params, grads = initial_params(), grad_sequence(20)
    for decoupled, torch_cls in [(True, torch.optim.AdamW), (False, torch.optim.Adam)]:
        mode = {"adam_w_mode": decoupled} if cls is FusedAdam else {"adamw_mode": decoupled}
        got, _ = run(lambda ps: cls(ps, lr=1e-3, weight_decay=0.01, **mode), params, grads)
        want, _ = run(lambda ps: torch_cls(ps, lr=1e-3, weight_decay=0.01), params, grads)
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w, **TOL)


def test_param_groups_keep_their_own_lr_and_weight_decay():
    params, grads = initial_params(), grad_sequence()
    got, _ = run(lambda ps: FusedAdam([{"params": [ps[0]], "lr": 0.05, "weight_decay": 0.2},
                                       {"params": [ps[1]]}], lr=0.01), params, grads)
    torch.testing.assert_close(got[0], ref_adam(params[0], per_tensor(grads, 0), 0.05, 0.9, 0.999,
                                                1e-8, 0.2, True, True).float(), **TOL)
    torch.testing.assert_close(got[1], ref_adam(params[1], per_tensor(grads, 1), 0.01, 0.9, 0.999,
                                                1e-8, 0.0, True, True).float(), **TOL)


# ------------------------------------------------------------------ Lion, Adagrad
@pytest.mark.parametrize("cls", [FusedLion, DeepSpeedCPULion])
@pytest.mark.parametrize("wd", [0.0, 0.1])
def test_lion_matches_equations(cls, wd):
    params, grads = initial_params(), grad_sequence()
    got, _ = run(lambda ps: cls(ps, lr=1e-2, betas=(0.9, 0.99), weight_decay=wd), params, grads)
    for i, p in enumerate(params):
        reference = ref_lion(p, per_tensor(grads, i), 1e-2, 0.9, 0.99, wd)
        torch.testing.assert_close(got[i], reference.float(), **TOL)


def test_lion_defaults():
    opt = FusedLion([torch.nn.Parameter(torch.zeros(1))])
    assert opt.defaults["lr"] == 1e-4 and opt.defaults["betas"] == (0.9, 0.99)
    assert opt.defaults["weight_decay"] == 0


@pytest.mark.parametrize("wd", [0.0, 0.1])
def test_adagrad_matches_equations_and_torch(wd):
    params, grads = initial_params(), grad_sequence()
    got, _ = run(lambda ps: DeepSpeedCPUAdagrad(ps, lr=0.1, eps=1e-10, weight_decay=wd),
                 params, grads)
    want, _ = run(lambda ps: torch.optim.Adagrad(ps, lr=0.1, eps=1e-10, weight_decay=wd),
                  params, grads)
    for i, p in enumerate(params):
        reference = ref_adagrad(p, per_tensor(grads, i), 0.1, 1e-10, wd)
        torch.testing.assert_close(got[i], reference.float(), **TOL)
        torch.testing.assert_close(got[i], want[i], **TOL)


def test_adagrad_sparse_gradients_update_only_touched_rows():
    dense = torch.nn.Embedding(6, 3)
    sparse = torch.nn.Embedding(6, 3, sparse=True)
    sparse.weight.data.copy_(dense.weight.data)
    start = dense.weight.detach().clone()
    opt_dense = DeepSpeedCPUAdagrad(dense.parameters(), lr=0.1)
    opt_sparse = DeepSpeedCPUAdagrad(sparse.parameters(), lr=0.1)
    for ids in ([0, 2, 2], [2, 4]):
        for emb, opt in ((dense, opt_dense), (sparse, opt_sparse)):
            opt.zero_grad()
            emb(torch.tensor(ids)).pow(2).sum().backward()
            opt.step()
    assert sparse.weight.grad.is_sparse
    torch.testing.assert_close(sparse.weight, dense.weight, **TOL)
    untouched = [1, 3, 5]
    assert torch.equal(sparse.weight[untouched], start[untouched])


# ------------------------------------------------------------------ LAMB
@pytest.mark.parametrize("wd,bias_correction,eps_inside_sqrt",
                         [(0.0, True, False), (0.01, True, False), (0.01, False, True)])
def test_lamb_matches_equations(wd, bias_correction, eps_inside_sqrt):
    params, grads = initial_params(), grad_sequence()
    got, opt = run(lambda ps: FusedLamb(ps, lr=0.01, betas=(0.9, 0.99), eps=1e-6, weight_decay=wd,
                                        bias_correction=bias_correction,
                                        eps_inside_sqrt=eps_inside_sqrt), params, grads)
    last_coeffs = []
    for i, p in enumerate(params):
        want, coeffs = ref_lamb(p, per_tensor(grads, i), 0.01, 0.9, 0.99, 1e-6, wd, bias_correction,
                                eps_inside_sqrt)
        torch.testing.assert_close(got[i], want.float(), **TOL)
        last_coeffs.append(coeffs[-1])
    assert opt.get_lamb_coeffs() == pytest.approx(last_coeffs, rel=1e-5)


@pytest.mark.parametrize("scale,bound", [(1e3, 10.0), (1e-5, 0.01)])
def test_lamb_coefficient_clamps(scale, bound):
    params, grads = initial_params(scale), grad_sequence(2)
    got, opt = run(lambda ps: FusedLamb(ps, lr=1e-3), params, grads)
    assert opt.get_lamb_coeffs() == pytest.approx([bound, bound])
    for i, p in enumerate(params):
        want, coeffs = ref_lamb(p, per_tensor(grads, i), 1e-3, 0.9, 0.999, 1e-8, 0.0, True)
        assert coeffs == pytest.approx([bound, bound])
        torch.testing.assert_close(got[i], want.float(), rtol=1e-5, atol=1e-6 * max(scale, 1))


def test_lamb_zero_param_gets_coefficient_one():
    _, opt = run(lambda ps: FusedLamb(ps), [torch.zeros(3)], [[torch.ones(3)]])
    assert opt.get_lamb_coeffs() == [1.0]


def test_lamb_grad_norm_clipping_and_loss_scale():
    params, grads = initial_params(), grad_sequence(1)
    norm = math.sqrt(sum(float(g.norm()) ** 2 for g in grads[0]))
    max_norm = norm / 4
    clip = (norm + 1e-6) / max_norm  # > 1: the gradients are divided by it
    got, _ = run(lambda ps: FusedLamb(ps, lr=0.01, max_grad_norm=max_norm), params, grads)
    for i, p in enumerate(params):
        want, _ = ref_lamb(p, per_tensor(grads, i), 0.01, 0.9, 0.999, 1e-8, 0.0, True, scale=clip)
        torch.testing.assert_close(got[i], want.float(), **TOL)
    # loss-scaled gradients with their (scaled) norm passed in give the same step
    scale = 8.0
    tensors = [torch.nn.Parameter(q.clone()) for q in params]
    opt = FusedLamb(tensors, lr=0.01, max_grad_norm=max_norm)
    for t, g in zip(tensors, grads[0]):
        t.grad = g * scale
    opt.step(scale=scale, grad_norms=[norm * scale])
    for a, b in zip(tensors, got):
        torch.testing.assert_close(a.detach(), b, **TOL)


def test_strided_gradients_give_the_same_update_as_contiguous_ones():
    from deepspeed.ops.adam.functional import adam_update_

    torch.manual_seed(0)
    base = torch.randn(64, 32)
    strided = torch.randn(32, 64).t()  # non-contiguous view, same shape as base
    results = []
    for grad in (strided, strided.contiguous()):
        p, m, v = base.clone(), torch.zeros_like(base), torch.zeros_like(base)
        adam_update_([p], [grad], [m], [v], step=1, lr=0.1, beta1=0.9, beta2=0.999, eps=1e-8,
                     weight_decay=0.01, bias_correction=True, adamw_mode=True)
        results.append(p)
    assert torch.equal(results[0], results[1])
