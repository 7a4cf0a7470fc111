"""The standalone flops profiler: counting rules against hand-derived formulas, the API
lifecycle, and the printed profile."""
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from deepspeed.profiling.flops_profiler import (FlopsProfiler, get_model_profile,
                                                 macs_to_string, number_to_string,
                                                 params_to_string)


def mlp():
    return nn.Sequential(nn.Linear(10, 20), nn.ReLU(), nn.Linear(20, 5))


def profile(model, **kwargs):
    kwargs.setdefault("print_profile", False)
    kwargs.setdefault("as_string", False)
    return get_model_profile(model, **kwargs)


def n_params(model):
    return sum(p.numel() for p in model.parameters())


def test_mlp_golden_numbers():
    model = mlp()
    macs = 4 * 10 * 20 + 4 * 20 * 5
    relu = 4 * 20
    assert profile(model, input_shape=(4, 10)) == (2 * macs + relu, macs, n_params(model))
    assert profile(model, input_shape=(4, 10)) == (2480, 1200, 325)


def test_mlp_as_string():
    assert get_model_profile(mlp(), input_shape=(4, 10), print_profile=False) == \
        ("2.48 K", "1.2 KMACs", "325")
    assert number_to_string(6279.86e9) == "6279.86 G"
    assert macs_to_string(80) == "80 MACs"
    assert params_to_string(1.5e9) == "1.5 B"


def test_conv2d_relu_golden_numbers():
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU())
    positions = 2 * 16 * 16
    macs = positions * 8 * 3 * 3 * 3
    expected = (2 * macs + positions * 8 + positions * 8, macs, n_params(model))
    assert profile(model, input_shape=(2, 3, 16, 16)) == expected == (229376, 110592, 224)


class MatMul(nn.Module):
    def forward(self, a, b):
        return torch.matmul(a, b)


def test_args_and_kwargs_inputs():
    a, b = torch.randn(3, 4, 5), torch.randn(5, 6)
    assert profile(MatMul(), args=[a, b]) == (720, 360, 0)
    assert profile(MatMul(), args=[a], kwargs={"b": b}) == (720, 360, 0)
    assert profile(MatMul(), kwargs={"a": a, "b": b}) == (720, 360, 0)


class Generator(nn.Module):
    """``mode='generate'`` profiles ``generate``: here two forwards of the MLP."""

    def __init__(self):
        super().__init__()
        self.net = mlp()

    def forward(self, x):
        return self.net(x)

    def generate(self, x):
        return self(self(x)[:, :5].repeat(1, 2))


def test_generate_mode():
    assert profile(Generator(), input_shape=(4, 10), mode="generate") == (2 * 2480, 2 * 1200, 325)


def test_input_errors():
    with pytest.raises(AssertionError, match="args and/or kwargs must be specified"):
        get_model_profile(mlp())
    with pytest.raises(AssertionError, match="input_shape must be a tuple"):
        get_model_profile(mlp(), input_shape=[4, 10])
    with pytest.raises(AssertionError):
        get_model_profile(mlp(), input_shape=())
    with pytest.raises(AssertionError):
        get_model_profile(lambda x: x, input_shape=(4, 10))
    with pytest.raises(ValueError, match="mode"):
        get_model_profile(mlp(), input_shape=(4, 10), mode="backward")


def test_ignore_modules():
    assert profile(mlp(), input_shape=(4, 10), ignore_modules=[nn.ReLU]) == (2400, 1200, 325)
    assert profile(mlp(), input_shape=(4, 10), ignore_modules=[nn.Linear]) == (80, 0, 0)


class FunctionalLinear(nn.Module):
    """Calls F.linear itself: counted like nn.Linear although it is no nn.Linear."""

    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(7, 3))

    def forward(self, x):
        return F.gelu(F.linear(x, self.weight))


def test_functional_calls_in_custom_modules_are_counted():
    macs = 5 * 3 * 7
    assert profile(FunctionalLinear(), input_shape=(5, 3)) == (2 * macs + 5 * 7, macs, 21)


class Ops(nn.Module):
    def forward(self, x, y):
        s = F.scaled_dot_product_attention(x, y, y)  # (2,3,4,8) x (2,3,6,8)
        e = torch.einsum("bhqd,bhkd->bhqk", x, y)
        t = F.conv_transpose1d(torch.ones(1, 2, 5), torch.ones(2, 3, 3))
        return s, e, t


def test_attention_einsum_and_transposed_conv_rules():
    x, y = torch.randn(2, 3, 4, 8), torch.randn(2, 3, 6, 8)
    sdpa = 2 * 3 * 4 * 8 * 6 + 2 * 3 * 4 * 6 * 8
    einsum = 2 * 3 * 4 * 6 * 8
    transposed = 1 * 5 * 2 * 3 * 3
    macs = sdpa + einsum + transposed
    assert profile(Ops(), args=[x, y]) == (2 * macs, macs, 0)


class BadEinsum(nn.Module):
    def forward(self, a):
        return torch.einsum("ij,jk,kl->il", a, a, a)


class Upsample(nn.Module):
    def forward(self, x):
        return F.interpolate(x)


def test_unsupported_inputs_raise():
    with pytest.raises(NotImplementedError, match="einsum"):
        profile(BadEinsum(), input_shape=(3, 3), warm_up=0)
    with pytest.raises(AssertionError, match="channels"):
        profile(nn.Conv2d(3, 4, 3), input_shape=(1, 5, 8, 8), warm_up=0)
    with pytest.raises(AssertionError, match="size or scale_factor"):
        profile(Upsample(), input_shape=(1, 2, 4, 4), warm_up=0)
    assert F.conv2d.__module__ != __name__ and not hasattr(F.conv2d, "__wrapped__")


class Block(nn.Module):
    """A pre-LN GPT block."""

    def __init__(self, dim, heads):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.fc, self.out = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, d))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


def test_gpt_block_matches_analytic_flops():
    batch, seq, dim = 2, 16, 128
    block = Block(dim, heads=4)
    flops, _, params = profile(block, input_shape=(batch, seq, dim))
    assert params == n_params(block)
    tokens = batch * seq
    analytic = 2 * params * tokens + 2 * 2 * batch * seq * seq * dim
    assert abs(flops - analytic) / analytic < 0.01


def test_lifecycle_patches_and_restores():
    originals = (F.linear, torch.matmul, torch.Tensor.matmul, F.relu)
    model = mlp()
    prof = FlopsProfiler(model)
    prof.start_profile()
    assert F.linear is not originals[0] and torch.Tensor.matmul is not originals[2]
    model(torch.randn(4, 10))
    assert prof.get_total_flops() == 2480 and prof.get_total_macs() == 1200
    assert prof.get_total_params() == 325 and prof.get_total_duration() > 0
    assert prof.get_total_flops(as_string=True) == "2.48 K"
    prof.stop_profile()
    assert (F.linear, torch.matmul, torch.Tensor.matmul, F.relu) == originals
    model(torch.randn(4, 10))  # not counted any more
    assert prof.get_total_flops() == 2480
    prof.reset_profile()
    assert prof.get_total_flops() == 0 and prof.get_total_duration() == 0
    prof.end_profile()
    assert not any(hasattr(m, "__flops__") for m in model.modules())
    assert all(not m._forward_hooks and not m._forward_pre_hooks for m in model.modules())


def test_two_forwards_accumulate_and_second_profiler_is_refused():
    model = mlp()
    prof = FlopsProfiler(model)
    prof.start_profile()
    model(torch.randn(4, 10))
    model(torch.randn(4, 10))
    assert prof.get_total_flops() == 2 * 2480
    with pytest.raises(RuntimeError, match="already profiling"):
        FlopsProfiler(mlp()).start_profile()
    prof.end_profile()
    assert not hasattr(F.linear, "__wrapped__")


def test_print_model_profile_to_file(tmp_path):
    target = tmp_path / "sub" / "profile.txt"
    get_model_profile(mlp(), input_shape=(4, 10), output_file=str(target))
    text = target.read_text()
    for needle in ("DeepSpeed Flops Profiler", "fwd MACs per GPU: 1.2 KMACs",
                   "fwd flops per GPU: 2.48 K", "bwd flops per GPU = 2 * fwd flops per GPU: 4.96 K",
                   "Aggregated Profile per GPU", "depth 0:", "depth 1:",
                   "Linear(220 = 67.69% Params, 800 MACs = 66.67% MACs"):
        assert needle in text, needle


def test_print_depth_and_detail_switches(capsys):
    get_model_profile(mlp(), input_shape=(4, 10), detailed=False, module_depth=0)
    out = capsys.readouterr().out
    assert "depth 0:" in out and "depth 1:" not in out and "Detailed Profile" not in out
    prof = FlopsProfiler(mlp())
    prof.print_model_profile()  # before start_profile: nothing to print
    assert capsys.readouterr().out == ""
