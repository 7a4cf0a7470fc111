"""The native CPU optimizer kernels (csrc/cpu/) against the PyTorch path of the same optimizer.

Each op is JIT-built at most once per session (module-scoped fixtures; torch caches the build in
TORCH_EXTENSIONS_DIR). fp32 results must agree to 1e-6 relative (max abs diff / max abs value);
the fused bf16/fp16 copy must equal ``param.to(dtype)`` bit for bit.
"""
import pytest
import torch

from deepspeed.ops.adagrad import DeepSpeedCPUAdagrad
from deepspeed.ops.adam import DeepSpeedCPUAdam
from deepspeed.ops.adam.native import FORCE_FALLBACK_ENV, load_kernel
from deepspeed.ops.lion import DeepSpeedCPULion
from deepspeed.ops.op_builder.cpu_adagrad import CPUAdagradBuilder
from deepspeed.ops.op_builder.cpu_adam import CPUAdamBuilder
from deepspeed.ops.op_builder.cpu_lion import CPULionBuilder

SIZES = (0, 1, 7, 8, 15, 16, 1000, 65537)
STEPS = 3
RTOL = 1e-6


def _require(builder_class):
    builder = builder_class()
    if not builder.is_compatible():
        pytest.skip(f"{builder.NAME} cannot be built here: {builder.incompatible_reason}")
    return builder.load(verbose=False)


@pytest.fixture(scope="module")
def adam_op():
    return _require(CPUAdamBuilder)


@pytest.fixture(scope="module")
def adagrad_op():
    return _require(CPUAdagradBuilder)


@pytest.fixture(scope="module")
def lion_op():
    return _require(CPULionBuilder)


def _rel_err(a, b):
    scale = max(b.abs().max().item(), 1e-30) if b.numel() else 1.0
    return (a - b).abs().max().item() / scale if a.numel() else 0.0


def _make_params(seed):
    """Every size, split over two param groups (the second with its own hyperparameters)."""
    gen = torch.Generator().manual_seed(seed)
    tensors = [torch.randn(n, generator=gen) for n in SIZES]
    return [torch.nn.Parameter(t) for t in tensors]


def _run(optimizer_class, native, seed, group_kwargs, half_dtype=None, **kwargs):
    params = _make_params(seed)
    groups = [{"params": params[:4]}, {"params": params[4:], **group_kwargs}]
    optimizer = optimizer_class(groups, use_native=native, **kwargs)
    assert (optimizer.native is not None) == native
    gen = torch.Generator().manual_seed(seed + 1)
    halves = [torch.empty(p.shape, dtype=half_dtype) for p in params] if half_dtype else None
    for _ in range(STEPS):
        for p in params:
            p.grad = torch.randn(p.shape, generator=gen)
        if halves is None:
            optimizer.step()
        else:
            optimizer.step(fp16_param_groups=[halves[:4], halves[4:]])
    states = [optimizer.state[p] for p in params]
    return params, states, halves


def _compare(optimizer_class, state_keys, group_kwargs, half_dtype=None, **kwargs):
    native = _run(optimizer_class, True, 0, group_kwargs, half_dtype, **kwargs)
    torch_path = _run(optimizer_class, False, 0, group_kwargs, half_dtype, **kwargs)
    for p_native, p_torch in zip(native[0], torch_path[0]):
        assert _rel_err(p_native.detach(), p_torch.detach()) <= RTOL, p_native.numel()
    for s_native, s_torch in zip(native[1], torch_path[1]):
        assert s_native["step"] == s_torch["step"] == STEPS
        for key in state_keys:
            assert _rel_err(s_native[key], s_torch[key]) <= RTOL, (key, s_native[key].numel())
    if half_dtype is not None:
        for half, param in zip(native[2], native[0]):
            assert torch.equal(half, param.detach().to(half_dtype))


@pytest.mark.parametrize("weight_decay", [0.0, 0.1])
@pytest.mark.parametrize("bias_correction", [True, False])
@pytest.mark.parametrize("adamw_mode", [True, False])
def test_adam_matches_torch_path(adam_op, weight_decay, bias_correction, adamw_mode):
    _compare(DeepSpeedCPUAdam, ("exp_avg", "exp_avg_sq"), {"lr": 3e-3, "betas": (0.8, 0.99)},
             lr=1e-2, weight_decay=weight_decay, bias_correction=bias_correction,
             adamw_mode=adamw_mode)


@pytest.mark.parametrize("weight_decay", [0.0, 0.1])
def test_adagrad_matches_torch_path(adagrad_op, weight_decay):
    _compare(DeepSpeedCPUAdagrad, ("exp_avg_sq",), {"lr": 3e-3}, lr=1e-2,
             weight_decay=weight_decay)


@pytest.mark.parametrize("weight_decay", [0.0, 0.1])
def test_lion_matches_torch_path(lion_op, weight_decay):
    _compare(DeepSpeedCPULion, ("exp_avg",), {"lr": 3e-3, "betas": (0.8, 0.95)}, lr=1e-2,
             weight_decay=weight_decay)


@pytest.mark.parametrize("half_dtype", [torch.bfloat16, torch.float16])
def test_fused_half_copy_equals_cast(adam_op, adagrad_op, lion_op, half_dtype):
    _compare(DeepSpeedCPUAdam, ("exp_avg", "exp_avg_sq"), {}, half_dtype, weight_decay=0.01)
    _compare(DeepSpeedCPUAdagrad, ("exp_avg_sq",), {}, half_dtype)
    _compare(DeepSpeedCPULion, ("exp_avg",), {}, half_dtype)


def test_bf16_rounding_edge_cases(adam_op):
    """Ties, inf, subnormals and values near the bf16 max round exactly as torch's cast does
    (lr=0 leaves the params unchanged, so the fused copy is the cast of the inputs); NaN stays
    NaN (torch's scalar and vectorized casts disagree on its payload)."""
    values = torch.tensor([1.00390625, 1.01171875, -1.00390625, float("nan"), float("inf"),
                           -float("inf"), 3.3961e38, 1e-40, 0.0, -0.0], dtype=torch.float32)
    values = torch.cat([values, torch.randn(1000) * 1e3])
    param = torch.nn.Parameter(values.clone())
    param.grad = torch.zeros_like(param)
    out = torch.empty(param.shape, dtype=torch.bfloat16)
    optimizer = DeepSpeedCPUAdam([param], lr=0.0, use_native=True)
    optimizer.step(fp16_param_groups=[[out]])
    expected = values.to(torch.bfloat16)
    nan = values.isnan()
    assert out[nan].isnan().all()
    assert torch.equal(out[~nan].view(torch.int16), expected[~nan].view(torch.int16))


def test_unsupported_layouts_take_torch_path(adam_op):
    """Half params and strided params cannot be updated through a raw pointer; they go through
    the PyTorch path of the same optimizer, with the same result as use_native=False."""
    def run(native):
        gen = torch.Generator().manual_seed(3)
        strided = torch.nn.Parameter(torch.randn(8, 6, generator=gen).t())
        half = torch.nn.Parameter(torch.randn(33, generator=gen).to(torch.bfloat16))
        optimizer = DeepSpeedCPUAdam([strided, half], lr=1e-2, use_native=native)
        for _ in range(2):
            strided.grad = torch.randn(strided.shape, generator=gen)
            half.grad = torch.randn(half.shape, generator=gen).to(torch.bfloat16)
            optimizer.step()
        return strided.detach(), half.detach()

    for a, b in zip(run(True), run(False)):
        assert torch.equal(a, b)


def test_strided_grad_is_read_by_value(adam_op):
    """A non-contiguous gradient gives the same step as its contiguous copy (the kernel reads a
    contiguous copy). Reference: the PyTorch path on the contiguous copy. (The PyTorch path
    itself is wrong on strided grads: torch 2.13's CPU _fused_adamw_ misreads them.)"""
    gen = torch.Generator().manual_seed(5)
    start = torch.randn(65537, generator=gen)
    grad = torch.randn(2 * 65537, generator=gen)[::2]
    results = []
    for use_native, g in ((True, grad), (False, grad.contiguous())):
        param = torch.nn.Parameter(start.clone())
        param.grad = g
        DeepSpeedCPUAdam([param], lr=1e-2, use_native=use_native).step()
        results.append(param.detach())
    assert _rel_err(results[0], results[1]) <= RTOL


def test_device_copy_targets_not_fusable_still_written(adam_op):
    """A target the kernel cannot write (here: fp32, non-contiguous) is copied after the step."""
    param = torch.nn.Parameter(torch.randn(4, 5))
    param.grad = torch.randn(4, 5)
    target = torch.empty(5, 4).t()
    DeepSpeedCPUAdam([param], use_native=True).step(fp16_param_groups=[[target]])
    assert torch.equal(target, param.detach())


def test_force_fallback(monkeypatch):
    monkeypatch.setenv(FORCE_FALLBACK_ENV, "1")
    param = torch.nn.Parameter(torch.ones(3))
    assert DeepSpeedCPUAdam([param]).native is None
    assert load_kernel(CPUAdamBuilder, "X", None) is None
    monkeypatch.setenv(FORCE_FALLBACK_ENV, "yes")
    with pytest.raises(ValueError, match=FORCE_FALLBACK_ENV):
        DeepSpeedCPUAdam([param])
    with pytest.raises(ValueError, match="use_native"):
        DeepSpeedCPUAdam([param], use_native="auto")


def test_kernel_rejects_bad_arguments(adam_op):
    with pytest.raises(ValueError, match="half_kind"):
        adam_op.adam_update(0, 0, 0, 0, 0, 7, 0, lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-8,
                            weight_decay=0.0, step=1, bias_correction=True, adamw_mode=True)
    with pytest.raises(ValueError, match="step"):
        adam_op.adam_update(0, 0, 0, 0, 0, 0, 0, lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-8,
                            weight_decay=0.0, step=0, bias_correction=True, adamw_mode=True)
