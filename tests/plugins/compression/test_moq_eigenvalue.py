"""Eigenvalue MoQ (``quantize_training.eigenvalue``): the power iteration against a dense
Hessian and its stopping keys, and through the engine the layers it names getting periods
stretched by their sensitivity."""
import pytest
import torch
from cp_helpers import logged_lines

from deepspeed.compression.config import EigenvalueConfig


def _tiny_problem():
    """A small nonlinear layer and a loss over fixed data (float64)."""
    g = torch.Generator().manual_seed(3)
    layer = torch.nn.Linear(3, 2).double()
    with torch.no_grad():
        layer.weight.copy_(torch.randn(2, 3, generator=g))
        layer.bias.copy_(torch.randn(2, generator=g))
    x, y = (torch.randn(6, n, generator=g).double() for n in (3, 2))

    def loss_of(weight, bias):
        return (torch.tanh(x @ weight.t() + bias) - y).pow(2).mean()

    return layer, loss_of


def _dense_top_eigenvalue(layer, loss_of):
    sizes = [p.numel() for p in layer.parameters()]
    shapes = [p.shape for p in layer.parameters()]

    def flat_loss(flat):
        weight, bias = (piece.view(shape) for piece, shape in zip(flat.split(sizes), shapes))
        return loss_of(weight, bias)

    flat = torch.cat([p.detach().reshape(-1) for p in layer.parameters()])
    eigenvalues = torch.linalg.eigvalsh(torch.autograd.functional.hessian(flat_loss, flat))
    return float(eigenvalues[eigenvalues.abs().argmax()])


def test_power_iteration_agrees_with_the_dense_hessian():
    from deepspeed.compression.eigenvalue import power_iteration

    layer, loss_of = _tiny_problem()
    config = EigenvalueConfig.model_validate({"max_iter": 500, "tol": 1e-9, "stability": 0})
    value, products = power_iteration(loss_of(layer.weight, layer.bias), layer.parameters(),
                                      config)
    assert value == pytest.approx(_dense_top_eigenvalue(layer, loss_of), rel=1e-6)
    assert 2 < products < 500


def test_max_iter_tol_and_stability_bound_the_iteration():
    from deepspeed.compression.eigenvalue import START_SEED, power_iteration

    layer, loss_of = _tiny_problem()
    loss = loss_of(layer.weight, layer.bias)
    params = list(layer.parameters())
    # max_iter 1: the Rayleigh quotient of the start vector, normalised by |v| + stability
    g = torch.Generator().manual_seed(START_SEED)
    start = [torch.randn(p.shape, generator=g).to(p) for p in params]
    grads = torch.autograd.grad(loss, params, create_graph=True)
    hessian_v = torch.autograd.grad(grads, params, grad_outputs=start, retain_graph=True)
    norm = torch.cat([v.reshape(-1) for v in start]).norm().item()
    quotient = sum(float((h * v).sum()) for h, v in zip(hessian_v, start))
    one = EigenvalueConfig.model_validate({"max_iter": 1, "stability": 0.5})
    assert power_iteration(loss, params, one) == (pytest.approx(quotient / (norm + 0.5) ** 2,
                                                                rel=1e-9), 1)
    # a loose tol stops at the first comparison (two products)
    loose = EigenvalueConfig.model_validate({"max_iter": 50, "tol": 10.0})
    assert power_iteration(loss, params, loose)[1] == 2


def test_period_factors_reach_five_for_the_most_sensitive_layer():
    from deepspeed.compression.eigenvalue import layer_eigenvalues, period_factors

    assert period_factors({"a": 2.0, "b": 1.0, "c": 0.1}) == {"a": 5, "b": 3, "c": 1}
    layer, loss_of = _tiny_problem()

    class Broken(torch.nn.Module):  # a NaN eigenvalue becomes the largest finite one
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.ones(2, dtype=torch.float64))

    broken = Broken()
    loss = loss_of(layer.weight, layer.bias) + (broken.w.pow(2) * float("nan")).sum()
    config = EigenvalueConfig.model_validate({"max_iter": 3})
    found = layer_eigenvalues(loss, [("good", layer), ("broken", broken)], config)
    assert found["broken"] == found["good"]


# ---------------------------------------------------------------- through the engine
BLOCKS = 3
EIGEN = {"enabled": True, "layer_name": "blocks", "layer_num": 2, "gas_boundary_resolution": 2,
         "verbose": True, "max_iter": 20}


class _Net(torch.nn.Module):
    """Blocks whose inputs grow in scale, so their Hessians differ."""

    def __init__(self):
        super().__init__()
        self.blocks = torch.nn.ModuleList(torch.nn.Linear(4, 4) for _ in range(BLOCKS))

    def forward(self, x):
        for idx, block in enumerate(self.blocks):
            x = torch.tanh(block(x * (1 + 2 * idx)))
        return x


def _eigen_moq(steps):
    import deepspeed

    torch.manual_seed(0)
    model = _Net()
    with logged_lines() as lines:
        engine, *_ = deepspeed.initialize(
            model=model, model_parameters=model.parameters(),
            config={"train_micro_batch_size_per_gpu": 4,
                    "optimizer": {"type": "SGD", "params": {"lr": 0.01}},
                    "quantize_training": {
                        "enabled": True, "quantize_bits": {"start_bits": 12, "target_bits": 4},
                        "quantize_schedule": {"quantize_period": 1, "schedule_offset": 0},
                        "eigenvalue": EIGEN}})
        g = torch.Generator().manual_seed(1)
        for _ in range(steps):
            engine.backward(engine(torch.randn(4, 4, generator=g)).pow(2).mean())
            engine.step()
        quantizer = engine.quantizer
        periods = {name: s.period for name, s in quantizer.layers.items()}
        result = (quantizer.plain.period, periods, dict(quantizer.factors))
        engine.destroy()
    return result, [line for line in lines if "MoQ eigenvalues" in line]


def test_sensitive_layers_get_longer_quantization_periods(dist_pool):
    (plain, periods, factors), logged = dist_pool.run(_eigen_moq, world_size=1, args=(4, ))[0]
    assert sorted(periods) == ["blocks.0", "blocks.1"]  # layer_name, layer_num
    assert len(logged) == 2  # verbose, at steps 0 and 2 (gas_boundary_resolution)
    most = max(factors, key=factors.get)
    assert factors[most] == 5 and min(factors.values()) < 5
    for name, factor in factors.items():  # stretched by its factor at each drop after the first
        assert (periods[name] > plain) == (factor > 1)
    assert periods[most] > plain
