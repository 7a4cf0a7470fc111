"""The standalone flops profiler: counting rules against hand-derived formulas, the API
lifecycle, and the printed profile."""
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from deepspeed.profiling.flops_profiler import (FlopsProfiler, get_model_profile,
                                                 macs_to_string, number_to_string,
                                                 params_to_string)
from tiny_models import mlp as tiny_mlp


# The counting conventions (deepspeed.profiling.flops_profiler.counting), which every expected
# number below is written out from:
#   Linear / matmul   one MAC per (output element, summed input feature); flops = 2 * MACs, the
#                     bias add is not counted
#   convolution       MACs = output positions * out channels * (in channels * kernel area);
#                     flops = 2 * MACs + one bias add per output element
#   activations       one flop per element, no MACs
#   params            weights + biases of the profiled modules

# mlp(): Linear(IN, HIDDEN) -> ReLU -> Linear(HIDDEN, OUT), profiled on a (BATCH, IN) input
BATCH, IN, HIDDEN, OUT = 4, 10, 20, 5
FC1_MACS = BATCH * IN * HIDDEN                  # 4 * 10 * 20 = 800
FC2_MACS = BATCH * HIDDEN * OUT                 # 4 * 20 * 5 = 400
MLP_MACS = FC1_MACS + FC2_MACS                  # 1200
RELU_FLOPS = BATCH * HIDDEN                     # the ReLU's input is (4, 20): 80
MLP_FLOPS = 2 * MLP_MACS + RELU_FLOPS           # 2400 + 80 = 2480
FC1_PARAMS = IN * HIDDEN + HIDDEN               # 200 + 20 = 220
FC2_PARAMS = HIDDEN * OUT + OUT                 # 100 + 5 = 105
MLP_PARAMS = FC1_PARAMS + FC2_PARAMS            # 325


def mlp():
    """Linear(IN, HIDDEN) -> ReLU -> Linear(HIDDEN, OUT); no counted number depends on the
    weights, so the global RNG is left alone."""
    return tiny_mlp(IN, HIDDEN, OUT, activation=nn.ReLU, seed=None)


def profile(model, **kwargs):
    kwargs.setdefault("print_profile", False)
    kwargs.setdefault("as_string", False)
    return get_model_profile(model, **kwargs)


def n_params(model):
    return sum(p.numel() for p in model.parameters())


def test_mlp_golden_numbers():
    model = mlp()
    assert MLP_PARAMS == n_params(model)  # the hand count agrees with torch's
    assert profile(model, input_shape=(BATCH, IN)) == (MLP_FLOPS, MLP_MACS, MLP_PARAMS)


def test_mlp_as_string():
    # the derivation's 2480 flops, 1200 MACs and 325 params, in the profiler's units
    assert (MLP_FLOPS, MLP_MACS, MLP_PARAMS) == (2480, 1200, 325)
    assert get_model_profile(mlp(), input_shape=(BATCH, IN), print_profile=False) == \
        ("2.48 K", "1.2 KMACs", "325")
    assert number_to_string(6279.86e9) == "6279.86 G"
    assert macs_to_string(80) == "80 MACs"
    assert params_to_string(1.5e9) == "1.5 B"


def test_conv2d_relu_golden_numbers():
    batch, c_in, c_out, k, h, w = 2, 3, 8, 3, 16, 16
    model = nn.Sequential(nn.Conv2d(c_in, c_out, k, padding=1), nn.ReLU())
    positions = batch * h * w                       # padding=1 keeps 16x16 outputs: 512
    macs = positions * c_out * c_in * k * k         # 512 * 8 * 27 = 110592
    bias_adds = positions * c_out                   # one per output element: 4096
    relu = positions * c_out                        # the ReLU sees the same 4096 elements
    flops = 2 * macs + bias_adds + relu             # 221184 + 4096 + 4096 = 229376
    params = c_out * c_in * k * k + c_out           # 216 weights + 8 biases = 224
    assert params == n_params(model)
    assert profile(model, input_shape=(batch, c_in, h, w)) == (flops, macs, params)


class MatMul(nn.Module):
    def forward(self, a, b):
        return torch.matmul(a, b)


def test_args_and_kwargs_inputs():
    a, b = torch.randn(3, 4, 5), torch.randn(5, 6)
    macs = 3 * 4 * 6 * 5  # (3, 4, 6) output elements, each a sum over 5: 360
    expected = (2 * macs, macs, 0)  # 720 flops; MatMul has no parameters
    assert profile(MatMul(), args=[a, b]) == expected
    assert profile(MatMul(), args=[a], kwargs={"b": b}) == expected
    assert profile(MatMul(), kwargs={"a": a, "b": b}) == expected


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
    # generate() runs the MLP twice on (BATCH, IN) inputs: twice the work, the same parameters
    assert profile(Generator(), input_shape=(BATCH, IN), mode="generate") == \
        (2 * MLP_FLOPS, 2 * MLP_MACS, MLP_PARAMS)


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
        get_model_profile(mlp(), input_shape=(BATCH, IN), mode="backward")


def test_ignore_modules():
    # without the ReLU: only the two Linears (2400 flops)
    assert profile(mlp(), input_shape=(BATCH, IN), ignore_modules=[nn.ReLU]) == \
        (2 * MLP_MACS, MLP_MACS, MLP_PARAMS)
    # without the Linears: only the ReLU's 80 flops, and no parameters (ReLU has none)
    assert profile(mlp(), input_shape=(BATCH, IN), ignore_modules=[nn.Linear]) == \
        (RELU_FLOPS, 0, 0)


class FunctionalLinear(nn.Module):
    """Calls F.linear itself: counted like nn.Linear although it is no nn.Linear."""

    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(7, 3))

    def forward(self, x):
        return F.gelu(F.linear(x, self.weight))


def test_functional_calls_in_custom_modules_are_counted():
    rows, in_features, out_features = 5, 3, 7   # input (5, 3), weight (7, 3)
    macs = rows * in_features * out_features    # 105
    gelu = rows * out_features                  # on the (5, 7) output: 35
    params = out_features * in_features         # the weight, no bias: 21
    assert profile(FunctionalLinear(), input_shape=(rows, in_features)) == \
        (2 * macs + gelu, macs, params)


class Ops(nn.Module):
    def forward(self, x, y):
        s = F.scaled_dot_product_attention(x, y, y)  # (2,3,4,8) x (2,3,6,8)
        e = torch.einsum("bhqd,bhkd->bhqk", x, y)
        t = F.conv_transpose1d(torch.ones(1, 2, 5), torch.ones(2, 3, 3))
        return s, e, t


def test_attention_einsum_and_transposed_conv_rules():
    batch, heads, q_len, kv_len, dim = 2, 3, 4, 6, 8
    x, y = torch.randn(batch, heads, q_len, dim), torch.randn(batch, heads, kv_len, dim)
    # attention: scores Q @ K^T ((4, 6) per head, each a sum over 8), then weights @ V
    # ((4, 8) per head, each a sum over 6); softmax and scaling are not counted
    sdpa = batch * heads * q_len * dim * kv_len + batch * heads * q_len * kv_len * dim
    einsum = batch * heads * q_len * kv_len * dim  # "bhqd,bhkd->bhqk": a sum over d per output
    # conv_transpose1d, input (1, 2, 5), weight (2, 3, 3): every input element (1 * 2 * 5)
    # is scattered through out_channels * kernel = 3 * 3 weights; no bias
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
    model(torch.randn(BATCH, IN))
    assert prof.get_total_flops() == MLP_FLOPS and prof.get_total_macs() == MLP_MACS
    assert prof.get_total_params() == MLP_PARAMS and prof.get_total_duration() > 0
    assert prof.get_total_flops(as_string=True) == "2.48 K"  # MLP_FLOPS = 2480
    prof.stop_profile()
    assert (F.linear, torch.matmul, torch.Tensor.matmul, F.relu) == originals
    model(torch.randn(BATCH, IN))  # not counted any more
    assert prof.get_total_flops() == MLP_FLOPS
    prof.reset_profile()
    assert prof.get_total_flops() == 0 and prof.get_total_duration() == 0
    prof.end_profile()
    assert not any(hasattr(m, "__flops__") for m in model.modules())
    assert all(not m._forward_hooks and not m._forward_pre_hooks for m in model.modules())


def test_two_forwards_accumulate_and_second_profiler_is_refused():
    model = mlp()
    prof = FlopsProfiler(model)
    prof.start_profile()
    model(torch.randn(BATCH, IN))
    model(torch.randn(BATCH, IN))
    assert prof.get_total_flops() == 2 * MLP_FLOPS
    with pytest.raises(RuntimeError, match="already profiling"):
        FlopsProfiler(mlp()).start_profile()
    prof.end_profile()
    assert not hasattr(F.linear, "__wrapped__")


def test_print_model_profile_to_file(tmp_path):
    target = tmp_path / "sub" / "profile.txt"
    get_model_profile(mlp(), input_shape=(BATCH, IN), output_file=str(target))
    text = target.read_text()
    # MLP_MACS = 1200, MLP_FLOPS = 2480 and twice that backward; the first Linear holds
    # 220 / 325 = 67.69% of the parameters and does 800 / 1200 = 66.67% of the MACs
    first_linear = (f"Linear({FC1_PARAMS} = {100 * FC1_PARAMS / MLP_PARAMS:.2f}% Params, "
                    f"{FC1_MACS} MACs = {100 * FC1_MACS / MLP_MACS:.2f}% MACs")
    assert first_linear == "Linear(220 = 67.69% Params, 800 MACs = 66.67% MACs"
    for needle in ("DeepSpeed Flops Profiler", "fwd MACs per GPU: 1.2 KMACs",
                   "fwd flops per GPU: 2.48 K", "bwd flops per GPU = 2 * fwd flops per GPU: 4.96 K",
                   "Aggregated Profile per GPU", "depth 0:", "depth 1:", first_linear):
        assert needle in text, needle


def test_print_depth_and_detail_switches(capsys):
    get_model_profile(mlp(), input_shape=(BATCH, IN), detailed=False, module_depth=0)
    out = capsys.readouterr().out
    assert "depth 0:" in out and "depth 1:" not in out and "Detailed Profile" not in out
    prof = FlopsProfiler(mlp())
    prof.print_model_profile()  # before start_profile: nothing to print
    assert capsys.readouterr().out == ""


def test_flops_by_module_plot_beside_the_text_profile(tmp_path):
    from png_checks import assert_png, bars

    model = mlp()
    prof = FlopsProfiler(model)
    prof.start_profile()
    model(torch.randn(BATCH, IN))
    figure = prof.plot_flops_by_module(tmp_path / "flops.png")
    assert_png(tmp_path / "flops.png")
    drawn = bars(figure.axes[0])
    assert [label for label, _ in drawn] == ["0", "1", "2"]  # the Sequential's children
    assert sum(mflops for _, mflops in drawn) * 1e6 == pytest.approx(MLP_FLOPS)
    assert drawn[1][1] < drawn[0][1]  # ReLU costs less than the Linear before it
    # the profile written to a file gets its plot next to it
    prof.print_model_profile(output_file=str(tmp_path / "profile.txt"))
    assert_png(tmp_path / "profile.png")
    prof.end_profile()
