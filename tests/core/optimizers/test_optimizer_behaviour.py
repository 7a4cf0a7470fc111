"""What the DeepSpeed optimizers promise besides their math: state round trips, dtypes, the
documented errors and the legacy step arguments."""
import io

import pytest
import torch

from deepspeed.ops.adagrad import DeepSpeedCPUAdagrad
from deepspeed.ops.adam import DeepSpeedCPUAdam, FusedAdam
from deepspeed.ops.lamb import FusedLamb
from deepspeed.ops.lion import DeepSpeedCPULion, FusedLion

ALL = [
    lambda ps: FusedAdam(ps, lr=0.01, weight_decay=0.1),
    lambda ps: DeepSpeedCPUAdam(ps, lr=0.01, adamw_mode=False, weight_decay=0.1),
    lambda ps: FusedLamb(ps, lr=0.01, weight_decay=0.01),
    lambda ps: FusedLion(ps, lr=0.01, weight_decay=0.1),
    lambda ps: DeepSpeedCPULion(ps, lr=0.01),
    lambda ps: DeepSpeedCPUAdagrad(ps, lr=0.1, weight_decay=0.1),
]
NAMES = ["FusedAdam", "DeepSpeedCPUAdam", "FusedLamb", "FusedLion", "DeepSpeedCPULion",
         "DeepSpeedCPUAdagrad"]


def _params(dtype=torch.float32):
    g = torch.Generator().manual_seed(0)
    return [torch.nn.Parameter(torch.randn(3, 2, generator=g).to(dtype)),
            torch.nn.Parameter(torch.randn(4, generator=g).to(dtype))]


def _steps(opt, params, seed, count):
    g = torch.Generator().manual_seed(seed)
    for _ in range(count):
        for p in params:
            p.grad = torch.randn(p.shape, generator=g).to(p.dtype)
        opt.step()


@pytest.mark.parametrize("make", ALL, ids=NAMES)
def test_state_dict_round_trip_continues_identically(make):
    params = _params()
    opt = make(params)
    _steps(opt, params, seed=1, count=3)
    buffer = io.BytesIO()  # through a checkpoint file: no tensor shared with `opt`
    torch.save(opt.state_dict(), buffer)
    buffer.seek(0)
    saved = torch.load(buffer)
    clone = [torch.nn.Parameter(p.detach().clone()) for p in params]
    resumed = make(clone)
    resumed.load_state_dict(saved)
    _steps(opt, params, seed=2, count=2)
    _steps(resumed, clone, seed=2, count=2)
    for a, b in zip(params, clone):
        assert torch.equal(a, b)


@pytest.mark.parametrize("cls", [DeepSpeedCPUAdam, DeepSpeedCPULion, DeepSpeedCPUAdagrad])
def test_cpu_optimizers_keep_fp32_states_for_bf16_params_across_load(cls):
    params = _params(torch.bfloat16)
    opt = cls(params)
    _steps(opt, params, seed=1, count=2)
    states = [t for s in opt.state.values() for t in s.values() if torch.is_tensor(t)]
    assert states and all(t.dtype == torch.float32 for t in states)
    assert all(p.dtype == torch.bfloat16 for p in params)
    resumed = cls([torch.nn.Parameter(p.detach().clone()) for p in params])
    resumed.load_state_dict(opt.state_dict())
    for before, after in zip(opt.state.values(), resumed.state.values()):
        for key, value in before.items():
            if torch.is_tensor(value):
                assert after[key].dtype == torch.float32 and torch.equal(after[key], value)


def test_cpu_adam_half_precision_states_when_asked():
    params = _params(torch.bfloat16)
    opt = DeepSpeedCPUAdam(params, fp32_optimizer_states=False)
    _steps(opt, params, seed=1, count=1)
    assert {t.dtype for s in opt.state.values() for k, t in s.items() if k != "step"} == \
        {torch.bfloat16}


def test_fused_adam_half_params_match_fp32_math():
    """A bf16 step is the fp32 step rounded once (math in fp32, as the kernels do)."""
    params32 = _params()
    params16 = [torch.nn.Parameter(p.detach().to(torch.bfloat16)) for p in params32]
    start = [p.detach().clone() for p in params16]
    for p in params32:
        p.data.copy_(p.data.to(torch.bfloat16).float())
    opt32, opt16 = FusedAdam(params32, lr=0.1), FusedAdam(params16, lr=0.1)
    for p32, p16 in zip(params32, params16):
        p16.grad = torch.ones_like(p16)
        p32.grad = torch.ones_like(p32)
    opt32.step()
    opt16.step()
    for p32, p16, s in zip(params32, params16, start):
        assert not torch.equal(p16, s)
        assert torch.equal(p16, p32.detach().to(torch.bfloat16))
    assert opt16.state[params16[0]]["exp_avg"].dtype == torch.bfloat16


def test_cpu_adam_copies_into_fp16_param_groups():
    params = _params()
    device_copies = [torch.zeros_like(p, dtype=torch.float16) for p in params]
    opt = DeepSpeedCPUAdam(params, lr=0.1)
    for p in params:
        p.grad = torch.ones_like(p)
    opt.step(fp16_param_groups=device_copies)
    for p, copy in zip(params, device_copies):
        assert torch.equal(copy, p.detach().half())


def test_cpu_optimizers_refuse_params_off_the_host():
    param = torch.nn.Parameter(torch.zeros(2, device="meta"))
    param.grad = torch.zeros(2, device="meta")
    for cls in (DeepSpeedCPUAdam, DeepSpeedCPULion, DeepSpeedCPUAdagrad):
        with pytest.raises(AssertionError, match="offload_optimizer"):
            cls([param]).step()


@pytest.mark.parametrize("cls", [FusedAdam, FusedLamb])
def test_amsgrad_is_refused(cls):
    with pytest.raises(RuntimeError, match=f"{cls.__name__} does not support the AMSGrad variant"):
        cls(_params(), amsgrad=True)


# AMSGrad matters when gradients shrink: after large gradients the running max of the second
# moment stays large while exp_avg_sq decays, so AMSGrad's later steps are smaller than Adam's.
# beta2 = 0.9 lets exp_avg_sq decay within the ten small steps (at 0.999 the two differ by
# ~1e-4 only); then every element ends > 1e-2 away from plain Adam's.
AMSGRAD_GRADS = [10.0] * 3 + [0.01] * 10
BETAS = (0.9, 0.9)


def _amsgrad_run(make, shrinking=AMSGRAD_GRADS):
    params = _params()
    opt = make(params)
    g = torch.Generator().manual_seed(7)
    for scale in shrinking:
        for p in params:
            p.grad = scale * (1 + torch.rand(p.shape, generator=g))  # same sign, varying size
        opt.step()
    return [p.detach().clone() for p in params]


def _everywhere_apart(got, want, by=1e-3):
    """Every element differs by more than ``by`` (100x the tolerance of ``_assert_all_close``)."""
    return all((a - b).abs().min() > by for a, b in zip(got, want))


def _assert_all_close(got, want):
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_the_amsgrad_gradient_sequence_tells_amsgrad_from_adam():
    """The premise of the tests below: on this sequence torch's AMSGrad visibly differs."""
    adam = _amsgrad_run(lambda ps: torch.optim.Adam(ps, lr=0.01, betas=BETAS))
    amsgrad = _amsgrad_run(lambda ps: torch.optim.Adam(ps, lr=0.01, betas=BETAS, amsgrad=True))
    assert _everywhere_apart(adam, amsgrad)


@pytest.mark.parametrize("adamw_mode, torch_cls", [(False, torch.optim.Adam),
                                                   (True, torch.optim.AdamW)])
def test_cpu_adam_ignores_amsgrad(adamw_mode, torch_cls):
    """``amsgrad=True`` is accepted and ignored, as upstream: the steps are plain Adam(W) (bit
    for bit the ``amsgrad=False`` ones, equal to torch's non-AMSGrad optimizer), not torch's
    AMSGrad, even where AMSGrad would change them."""
    kwargs = dict(lr=0.01, betas=BETAS, weight_decay=0.1)
    made = _amsgrad_run(lambda ps: DeepSpeedCPUAdam(ps, adamw_mode=adamw_mode, amsgrad=True,
                                                    **kwargs))
    plain = _amsgrad_run(lambda ps: DeepSpeedCPUAdam(ps, adamw_mode=adamw_mode, **kwargs))
    for a, b in zip(made, plain):
        assert torch.equal(a, b)
    _assert_all_close(made, _amsgrad_run(lambda ps: torch_cls(ps, **kwargs)))
    amsgrad = _amsgrad_run(lambda ps: torch_cls(ps, amsgrad=True, **kwargs))
    assert _everywhere_apart(made, amsgrad)


def test_cpu_adagrad_ignores_amsgrad():
    """Adagrad has no AMSGrad variant: the flag is accepted (upstream's signature) and changes
    nothing, on the sequence where it would change Adam."""
    made = _amsgrad_run(lambda ps: DeepSpeedCPUAdagrad(ps, lr=0.1, amsgrad=True))
    plain = _amsgrad_run(lambda ps: DeepSpeedCPUAdagrad(ps, lr=0.1))
    for a, b in zip(made, plain):
        assert torch.equal(a, b)
    _assert_all_close(made, _amsgrad_run(lambda ps: torch.optim.Adagrad(ps, lr=0.1)))


@pytest.mark.parametrize("type_, adam_w_mode, torch_cls", [
    ("Adam", False, torch.optim.Adam), ("Adam", True, torch.optim.AdamW),
    ("AdamW", True, torch.optim.AdamW)])
def test_config_torch_adam_passes_amsgrad_through(type_, adam_w_mode, torch_cls):
    """``torch_adam: true`` builds torch's optimizer, which does implement AMSGrad: a config's
    ``amsgrad: true`` reaches it and the steps are torch's AMSGrad steps, not Adam's."""
    from deepspeed.config import DeepSpeedConfig
    from deepspeed.optimizers import build_optimizer

    def make(ps):
        params = {"lr": 0.01, "betas": list(BETAS), "weight_decay": 0.1, "torch_adam": True,
                  "adam_w_mode": adam_w_mode, "amsgrad": True}
        config = DeepSpeedConfig({"train_batch_size": 1,
                                  "optimizer": {"type": type_, "params": params}}, world_size=1)
        opt = build_optimizer(None, config, ps)
        assert type(opt) is torch_cls and opt.param_groups[0]["amsgrad"] is True
        return opt

    made = _amsgrad_run(make)
    kwargs = dict(lr=0.01, betas=BETAS, weight_decay=0.1)
    want = _amsgrad_run(lambda ps: torch_cls(ps, amsgrad=True, **kwargs))
    for a, b in zip(made, want):
        assert torch.equal(a, b)
    assert _everywhere_apart(made, _amsgrad_run(lambda ps: torch_cls(ps, **kwargs)))


@pytest.mark.parametrize("arg", ["grads", "output_params", "scale", "grad_norms"])
def test_fused_adam_refuses_legacy_step_arguments(arg):
    opt = FusedAdam(_params())
    with pytest.raises(RuntimeError, match="call step\\(\\) with no arguments"):
        opt.step(**{arg: [1.0]})


@pytest.mark.parametrize("cls", [FusedAdam, FusedLamb, FusedLion, DeepSpeedCPUAdam])
def test_sparse_gradients_are_refused(cls):
    emb = torch.nn.Embedding(4, 2, sparse=True)
    emb(torch.tensor([1])).sum().backward()
    with pytest.raises(RuntimeError, match="sparse"):
        cls(emb.parameters()).step()


def test_fused_adam_refuses_float64():
    param = torch.nn.Parameter(torch.zeros(2, dtype=torch.float64))
    param.grad = torch.ones_like(param)
    with pytest.raises(RuntimeError, match="float64"):
        FusedAdam([param]).step()


@pytest.mark.parametrize("cls", [FusedAdam, FusedLion])
def test_set_grad_none(cls):
    params = _params()
    for set_grad_none, expect_none in ((True, True), (False, False)):
        opt = cls(params, set_grad_none=set_grad_none)
        for p in params:
            p.grad = torch.ones_like(p)
        opt.zero_grad()
        if expect_none:
            assert all(p.grad is None for p in params)
        else:
            assert all(torch.equal(p.grad, torch.zeros_like(p)) for p in params)


def test_fused_adam_counts_steps_per_group_and_resumes_from_group_step():
    params = _params()
    opt = FusedAdam(params, lr=0.1)
    _steps(opt, params, seed=1, count=2)
    assert opt.param_groups[0]["step"] == 2
    fresh = [torch.nn.Parameter(p.detach().clone()) for p in params]
    regrouped = FusedAdam(fresh, lr=0.1)
    regrouped.param_groups[0]["step"] = 2  # as ZeRO-3 sets it on its sub-groups
    for p, q in zip(params, fresh):
        regrouped.state[q] = {k: v.clone() for k, v in opt.state[p].items()}
    _steps(opt, params, seed=2, count=1)
    _steps(regrouped, fresh, seed=2, count=1)
    for a, b in zip(params, fresh):
        assert torch.equal(a, b)


def test_lamb_legacy_grads_and_output_params():
    params, twins = _params(), _params()
    grads = [torch.ones_like(p) for p in params]
    outputs = [torch.zeros_like(p, dtype=torch.float16) for p in params]
    FusedLamb(params, lr=0.1).step(grads=grads, output_params=outputs)
    for p, g in zip(twins, grads):
        p.grad = g
    FusedLamb(twins, lr=0.1).step()
    for p, twin, out in zip(params, twins, outputs):
        assert torch.equal(p, twin) and torch.equal(out, p.detach().half())


def test_invalid_hyperparameters_name_the_argument():
    with pytest.raises(ValueError, match="lr=-1"):
        FusedAdam(_params(), lr=-1)
    with pytest.raises(ValueError, match="beta at index 1"):
        DeepSpeedCPULion(_params(), betas=(0.9, 1.0))
    with pytest.raises(ValueError, match="min_coeff"):
        FusedLamb(_params(), min_coeff=2.0, max_coeff=1.0)


def test_closure_is_evaluated_with_grad_enabled():
    param = torch.nn.Parameter(torch.ones(2))
    opt = FusedAdam([param], lr=0.1)

    def closure():
        opt.zero_grad()
        loss = (param ** 2).sum()
        loss.backward()
        return loss

    with torch.no_grad():
        loss = opt.step(closure)
    assert loss.item() == 2.0 and param[0].item() < 1.0


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("make", [ALL[0], ALL[2], ALL[3]],
                         ids=["FusedAdam", "FusedLamb", "FusedLion"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_optimizers_on_gpu_match_the_host(make, dtype):
    host = _params(dtype)
    device = [torch.nn.Parameter(p.detach().cuda()) for p in host]
    opt_host, opt_device = make(host), make(device)
    _steps(opt_host, host, seed=3, count=3)
    g = torch.Generator().manual_seed(3)
    for _ in range(3):
        for p in device:
            p.grad = torch.randn(p.shape, generator=g).to(dtype).cuda()
        opt_device.step()
    for a, b in zip(host, device):
        torch.testing.assert_close(b.detach().cpu(), a.detach())  # dtype-dependent tolerances


def test_reused_bucket_layout_follows_replaced_state_params_and_missing_grads():
    """The fused optimizers keep a group's bucketing between steps (its host cost rivalled
    the GPU kernel's); what they must still see each step: state entries replaced whole (as
    checkpoint loading does), a param converted to another dtype, and params without grads."""
    from deepspeed.ops.adam import FusedAdam

    def run(tamper):
        torch.manual_seed(0)
        params = [torch.nn.Parameter(torch.randn(5)) for _ in range(3)]
        opt = FusedAdam(params, lr=0.1)
        for step in range(4):
            for i, p in enumerate(params):
                p.grad = None if (step == 2 and i == 1) else torch.full_like(p, 0.5 + i)
            tamper(step, opt, params)
            opt.step()
        return [p.detach().clone() for p in params], opt

    baseline, _ = run(lambda *a: None)

    def replace_state(step, opt, params):
        if step == 3:  # a loaded checkpoint's entry, as a new dict
            opt.state[params[0]] = {k: torch.zeros_like(v) for k, v in opt.state[params[0]].items()}

    replaced, _ = run(replace_state)
    assert torch.equal(replaced[1], baseline[1]) and torch.equal(replaced[2], baseline[2])
    assert not torch.equal(replaced[0], baseline[0])  # fresh moments took effect

    def to_double(step, opt, params):
        if step == 3:
            params[2].data = params[2].data.double()
            params[2].grad = params[2].grad.double()

    with pytest.raises(RuntimeError, match="float64"):  # rebucketed, hence refused by dtype
        run(to_double)

    skipped = [torch.nn.Parameter(torch.ones(2)), torch.nn.Parameter(torch.ones(2))]
    opt = FusedAdam(skipped, lr=0.1)
    for step in range(3):
        skipped[0].grad = torch.ones(2)
        skipped[1].grad = torch.ones(2) if step != 1 else None
        opt.step()
    assert opt.state[skipped[1]]["exp_avg"].ne(0).all()
    assert not torch.equal(skipped[0], skipped[1])  # the param without a grad skipped a step
