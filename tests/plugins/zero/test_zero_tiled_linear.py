"""``deepspeed.zero.TiledLinear``: equal to ``nn.Linear`` (outputs and gradients) for every
documented argument, ``copy_params_from`` (plain and as a ZeRO-3 collective), and under ZeRO-3
the most parameter elements gathered at once shrinks with the number of tiles."""
import pytest
import torch

from deepspeed.testing.distributed import run_distributed
from deepspeed.zero.tiling import TiledLinear, TiledLinearReturnBias, split_sizes


def _reference(in_features=10, out_features=6, bias=True):
    torch.manual_seed(0)
    return torch.nn.Linear(in_features, out_features, bias=bias)


def _tile_grads(tiled):
    """The tiles' gradients mapped back to a full (out, in) weight gradient and bias gradient."""
    rows = []
    for row in tiled.linears:
        rows.append(torch.cat([tile.weight.grad for tile in row], dim=1))
    weight = torch.cat(rows, dim=0)
    biases = [row[-1].bias.grad for row in tiled.linears if row[-1].bias is not None]
    return weight, (torch.cat(biases) if biases else None)


@pytest.mark.parametrize("in_splits,out_splits", [(1, 1), (3, 2), (10, 6), (2, 5)])
@pytest.mark.parametrize("bias", [True, False])
def test_equals_linear_outputs_and_gradients(in_splits, out_splits, bias):
    lin = _reference(bias=bias)
    tiled = TiledLinear(10, 6, bias=bias, in_splits=in_splits, out_splits=out_splits,
                        init_linear=lin)
    x = torch.randn(4, 3, 10, generator=torch.Generator().manual_seed(1))
    x_ref, x_tiled = x.clone().requires_grad_(), x.clone().requires_grad_()
    y_ref, y = lin(x_ref), tiled(x_tiled)
    torch.testing.assert_close(y, y_ref, rtol=1e-6, atol=1e-6)
    grad_out = torch.randn_like(y_ref)
    y_ref.backward(grad_out)
    y.backward(grad_out)
    weight, bias_grad = _tile_grads(tiled)
    torch.testing.assert_close(weight, lin.weight.grad, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(x_tiled.grad, x_ref.grad, rtol=1e-6, atol=1e-6)
    if bias:
        torch.testing.assert_close(bias_grad, lin.bias.grad, rtol=1e-6, atol=1e-6)
    else:
        assert bias_grad is None


def test_only_the_last_input_tile_of_each_row_has_a_bias():
    tiled = TiledLinear(10, 6, in_splits=3, out_splits=2)
    assert [[tile.bias is not None for tile in row] for row in tiled.linears] == \
        [[False, False, True]] * 2
    assert [[tuple(t.weight.shape) for t in row] for row in tiled.linears] == \
        [[(3, 4), (3, 3), (3, 3)]] * 2
    assert split_sizes(10, 3) == [4, 3, 3]


def test_input_already_split_and_uncombined_outputs():
    lin = _reference()
    x = torch.randn(5, 10, generator=torch.Generator().manual_seed(2))
    pre = TiledLinear(10, 6, in_splits=3, out_splits=2, input_is_already_split=True,
                      init_linear=lin)
    torch.testing.assert_close(pre(torch.split(x, [4, 3, 3], -1)), lin(x), rtol=1e-6, atol=1e-6)
    with pytest.raises(AssertionError, match="in_splits=3"):
        pre(torch.split(x, [5, 5], -1))
    pieces = TiledLinear(10, 6, in_splits=3, out_splits=2, combine_out_splits=False,
                         init_linear=lin)(x)
    assert isinstance(pieces, list) and len(pieces) == 2
    torch.testing.assert_close(torch.cat(pieces, -1), lin(x), rtol=1e-6, atol=1e-6)


class CountingLinear(torch.nn.Linear):
    made = []

    def __init__(self, in_features, out_features, bias=True, **kwargs):
        super().__init__(in_features, out_features, bias=bias, **kwargs)
        CountingLinear.made.append(self)


def test_linear_cls_and_kwargs_reach_every_tile():
    CountingLinear.made = []
    tiled = TiledLinear(10, 6, in_splits=2, out_splits=3, linear_cls=CountingLinear,
                        dtype=torch.float64)
    tiles = [tile for row in tiled.linears for tile in row]
    assert len(CountingLinear.made) == 6 and all(isinstance(t, CountingLinear) for t in tiles)
    assert {t.weight.dtype for t in tiles} == {torch.float64}


class BiasReturning(torch.nn.Linear):
    """Megatron-style: the bias is returned, not added."""

    def forward(self, x):
        return torch.nn.functional.linear(x, self.weight), self.bias


def test_return_bias_variant_passes_the_bias_through():
    lin = _reference()
    tiled = TiledLinearReturnBias(10, 6, in_splits=2, out_splits=2, linear_cls=BiasReturning,
                                  init_linear=lin)
    x = torch.randn(3, 10)
    out, bias = tiled(x)
    torch.testing.assert_close(out, x @ lin.weight.t(), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(bias, lin.bias)


@pytest.mark.parametrize("kwargs", [{"in_splits": 5}, {"in_splits": 0}, {"out_splits": 5},
                                    {"out_splits": 0}])
def test_splits_outside_the_features_raise(kwargs):
    with pytest.raises(RuntimeError, match="splits"):
        TiledLinear(4, 4, **kwargs)


def test_copy_params_from_checks_shapes_and_bias():
    tiled = TiledLinear(10, 6, in_splits=2)
    with pytest.raises(AssertionError, match=r"\(6, 10\)"):
        tiled.copy_params_from(torch.nn.Linear(10, 7))
    with pytest.raises(AssertionError, match="bias"):
        tiled.copy_params_from(torch.nn.Linear(10, 6, bias=False))
    lin = _reference()
    tiled.copy_params_from(lin)
    x = torch.randn(2, 10)
    torch.testing.assert_close(tiled(x), lin(x), rtol=1e-6, atol=1e-6)


# ---------------------------------------------------------------------- under ZeRO-3
def _copy_under_zero3():
    """Each rank copies from a different nn.Linear: rank 0's values win on every rank."""
    import deepspeed
    from deepspeed import comm as dist

    rank = dist.get_rank()
    with deepspeed.zero.Init(config_dict_or_path={"zero_optimization": {"stage": 3}},
                             dtype=torch.float32):
        tiled = TiledLinear(10, 6, in_splits=3, out_splits=2)
    torch.manual_seed(100 + rank)
    other = torch.nn.Linear(10, 6)
    tiled.copy_params_from(other)
    params = list(tiled.parameters())
    with deepspeed.zero.GatheredParameters(params):
        x = torch.ones(1, 10)
        out = tiled(x).detach().clone()
    torch.manual_seed(100)
    rank0 = torch.nn.Linear(10, 6)
    return (torch.allclose(out, rank0(torch.ones(1, 10)), atol=1e-6),
            all(p.numel() == 0 for p in params))


def test_copy_params_from_is_a_collective_under_zero3():
    assert run_distributed(_copy_under_zero3, world_size=2) == [(True, True)] * 2


def _gathered_peak(splits, prefetch):
    """Train a ZeRO-3 TiledLinear(64, 64) for two steps; the most parameter elements the
    engine had gathered at once, and whether it trained like nn.Linear."""
    import deepspeed
    from deepspeed import comm as dist

    lin = _reference(64, 64)
    model = torch.nn.Sequential(TiledLinear(64, 64, in_splits=splits, out_splits=splits,
                                            init_linear=lin))
    config = {"train_micro_batch_size_per_gpu": 2, "zero_allow_untested_optimizer": True,
              "optimizer": {"type": "SGD", "params": {"lr": 0.1}},
              "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0,
                                    "stage3_prefetch_bucket_size": prefetch}}
    engine, *_ = deepspeed.initialize(model=model, config=config)
    world, rank = dist.get_world_size(), dist.get_rank()
    data = torch.randn(2 * 2 * world, 64, generator=torch.Generator().manual_seed(5))
    reference = torch.optim.SGD(lin.parameters(), lr=0.1)
    for step in range(2):
        batch = data[step * 2 * world:(step + 1) * 2 * world]
        engine.backward(engine(batch[rank * 2:rank * 2 + 2]).pow(2).mean())
        engine.step()
        lin(batch).pow(2).mean().backward()
        reference.step()
        reference.zero_grad()
    coordinator = next(engine.module.parameters()).ds_coordinator
    peak = coordinator.gathered_peak
    probe = torch.randn(3, 64)
    params = list(engine.module.parameters())
    with deepspeed.zero.GatheredParameters(params):
        same = torch.allclose(engine.module(probe), lin(probe), atol=1e-5)
    engine.destroy()
    return peak, same


@pytest.mark.parametrize("prefetch", [0, 300])
def test_gathered_peak_shrinks_with_the_tile_count(prefetch):
    """The working set is the running tile plus what the prefetch budget gathers ahead (a
    budget as large as the layer gathers every tile ahead, and tiling saves nothing)."""
    peaks = []
    for splits in (1, 2, 4):
        results = run_distributed(_gathered_peak, world_size=2, args=(splits, prefetch))
        assert all(same for _, same in results), results
        peaks.append(results[0][0])
    assert peaks[0] == 64 * 64 + 64
    assert peaks[0] > peaks[1] > peaks[2], peaks
    if prefetch == 0:  # one tile at a time: its weight plus (last input tile) its bias
        assert peaks[1] == 32 * 32 + 32 and peaks[2] == 16 * 16 + 16, peaks
    else:  # a 4x4 tile fits the budget: the next one is prefetched while one runs
        assert peaks[2] <= 2 * (16 * 16 + 16), peaks
