"""fp16 / bf16 training through the engine on 2 gloo ranks, against plain-PyTorch fp32."""
import logging
import re

import pytest
import torch

from rank_errors import error_of
from tiny_models import mlp, regression_data

STEPS, MICRO, WORLD = 4, 2, 2


def make_model():
    return mlp(8, 16, 4, activation=torch.nn.Tanh)


def make_data(gas):
    return regression_data(STEPS * MICRO * gas * WORLD, 8, 4)


def fp32_reference(gas, lr=0.05):
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    x, y = make_data(gas)
    batch = MICRO * gas * WORLD
    for s in range(STEPS):
        sl = slice(s * batch, (s + 1) * batch)
        torch.nn.functional.mse_loss(model(x[sl]), y[sl]).backward()
        opt.step()
        opt.zero_grad()
    return [p.detach() for p in model.parameters()]


def _train(precision, gas=1, extra=None, poison_steps=(), lr=0.05):
    import deepspeed
    from deepspeed import comm as dist

    config = {"train_micro_batch_size_per_gpu": MICRO, "gradient_accumulation_steps": gas,
              "optimizer": {"type": "SGD", "params": {"lr": lr}}, "steps_per_print": 1}
    config.update(precision)
    config.update(extra or {})
    engine, optimizer, _, _ = deepspeed.initialize(model=make_model(), config=config)
    dtype = next(engine.module.parameters()).dtype
    x, y = make_data(gas)
    rank = dist.get_rank()
    scales, grad_dtypes, before_after = [], set(), []
    micro = 0
    for s in range(STEPS):
        for m in range(gas):
            start = s * MICRO * gas * WORLD + rank * MICRO * gas + m * MICRO
            out = engine(x[start:start + MICRO].to(dtype))
            loss = torch.nn.functional.mse_loss(out.float(), y[start:start + MICRO])
            if s in poison_steps and m == gas - 1:
                loss = loss * float("inf")
            engine.backward(loss)
            grad_dtypes |= {p.grad.dtype for p in engine.module.parameters() if p.grad is not None}
            snapshot = [p.detach().clone() for p in engine.module.parameters()]
            engine.step()
            if engine.is_gradient_accumulation_boundary() or m == gas - 1:
                scales.append(getattr(optimizer, "cur_scale", None))
                before_after.append(all(torch.equal(a, b) for a, b in
                                        zip(snapshot, engine.module.parameters())))
            micro += 1
    params = [p.detach().float() for p in engine.module.parameters()]
    masters = None
    if hasattr(optimizer, "master_params"):
        masters = [m.detach() for m in optimizer.master_params()]
    return {"params": params, "dtype": dtype, "scales": scales, "unchanged": before_after,
            "skipped": engine.skipped_steps, "grad_dtypes": grad_dtypes, "masters": masters}


def _max_diff(a, b):
    return max(float((x - y).abs().max()) for x, y in zip(a, b))


def test_bf16_trains_close_to_fp32_with_fp32_masters(dist_pool):
    results = dist_pool.run(_train, args=({"bf16": {"enabled": True}},))
    reference = fp32_reference(1)
    for r in results:
        assert r["dtype"] == torch.bfloat16 and r["skipped"] == 0
        assert all(m.dtype == torch.float32 for m in r["masters"])
        assert _max_diff(r["masters"], reference) < 2e-2
    torch.testing.assert_close(results[0]["masters"], results[1]["masters"], rtol=0, atol=0)


def _accumulated_grads(extra, gas=8):
    """The reduced gradient after `gas` bf16 micro-batches, and the exact (float64) average
    of the very same per-micro-batch bf16 gradients."""
    import deepspeed
    from deepspeed import comm as dist

    engine, optimizer, _, _ = deepspeed.initialize(model=make_model(), config={
        "train_micro_batch_size_per_gpu": MICRO, "gradient_accumulation_steps": gas,
        "bf16": {"enabled": True}, "optimizer": {"type": "SGD", "params": {"lr": 0.1}}, **extra})
    params = list(engine.module.parameters())
    exact = [torch.zeros(p.shape, dtype=torch.float64) for p in params]
    g = torch.Generator().manual_seed(dist.get_rank())
    for micro in range(gas):
        x = torch.randn(MICRO, 8, generator=g).to(torch.bfloat16)
        loss = engine(x).float().pow(2).mean()
        for total, grad in zip(exact, torch.autograd.grad(loss / gas, params, retain_graph=True)):
            total += grad.double()
        engine.backward(loss)
        if micro < gas - 1:
            engine.step()  # counts the micro step; the last one is read before stepping
    for total in exact:
        dist.all_reduce(total)
        total /= dist.get_world_size()
    grads = optimizer.reduction_grads()
    return max(float((got.double() - want).abs().max()) for got, want in zip(grads, exact)), \
        {grad.dtype for grad in grads}


def test_bf16_fp32_grad_accumulation_is_closer_to_exact(dist_pool):
    lossy, lossy_dtypes = dist_pool.run(_accumulated_grads, args=({},))[0]
    exact, exact_dtypes = dist_pool.run(
        _accumulated_grads, args=({"data_types": {"grad_accum_dtype": "fp32"}},))[0]
    assert lossy_dtypes == {torch.bfloat16} and exact_dtypes == {torch.float32}
    assert exact < 1e-5 < lossy


def _immediate_grad_update(immediate, gas=3):
    """bf16 with fp32 accumulation over ``gas`` micro-batches: the reduced fp32 gradients, and
    whether the last Linear's bf16 gradients were already freed (moved into the accumulator)
    while backward was still on its way to the first Linear."""
    import deepspeed
    from deepspeed import comm as dist

    engine, optimizer, _, _ = deepspeed.initialize(model=make_model(), config={
        "train_micro_batch_size_per_gpu": MICRO, "gradient_accumulation_steps": gas,
        "bf16": {"enabled": True, "immediate_grad_update": immediate},
        "data_types": {"grad_accum_dtype": "fp32"},
        "optimizer": {"type": "SGD", "params": {"lr": 0.1}}})
    last = engine.module[2]
    freed_early = []

    def look(grad):  # the first Linear's output gradient: after the last Linear's
        freed_early.append(last.weight.grad is None and last.bias.grad is None)

    g = torch.Generator().manual_seed(dist.get_rank())
    for micro in range(gas):
        hidden = engine.module[0](torch.randn(MICRO, 8, generator=g).to(torch.bfloat16))
        hidden.register_hook(look)
        loss = engine.module[2](engine.module[1](hidden)).float().pow(2).mean()
        engine.backward(loss)
        if micro < gas - 1:
            engine.step()
    grads = [grad.clone() for grad in optimizer.reduction_grads()]
    engine.destroy()
    return grads, freed_early


def test_bf16_immediate_grad_update_frees_each_grad_during_backward(dist_pool):
    after, freed_after = dist_pool.run(_immediate_grad_update, args=(False,))[0]
    during, freed_during = dist_pool.run(_immediate_grad_update, args=(True,))[0]
    assert freed_during == [True] * 3 and freed_after == [False] * 3
    assert all(grad.dtype == torch.float32 for grad in during)
    torch.testing.assert_close(during, after, rtol=0, atol=0)  # the same sums, only earlier


def test_bf16_immediate_grad_update_needs_fp32_accumulation():
    from deepspeed.precision import BF16Optimizer

    model = make_model().to(torch.bfloat16)
    with pytest.raises(ValueError, match="immediate_grad_update.*grad_accum_dtype"):
        BF16Optimizer(torch.optim.SGD(model.parameters(), lr=0.1), immediate_grad_update=True)


def test_fp16_dynamic_scale_skips_overflow_steps(dist_pool, caplog):
    fp16 = {"fp16": {"enabled": True, "initial_scale_power": 4, "loss_scale_window": 2,
                     "hysteresis": 2}}
    results = dist_pool.run(_train, args=(fp16, 1, None, (1, 2)))
    for r in results:
        assert r["dtype"] == torch.float16 and r["skipped"] == 2
        # step 0 clean, 1 overflow (hysteresis absorbs), 2 overflow (halves), 3 clean
        assert r["scales"] == [16.0, 16.0, 8.0, 8.0]
        assert r["unchanged"] == [False, True, True, False]


def _overflow_logged():
    import io

    from deepspeed.utils.logging import logger

    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    logger.addHandler(handler)
    try:
        _train({"fp16": {"enabled": True, "initial_scale_power": 3, "hysteresis": 1}},
               1, None, (0,))
    finally:
        logger.removeHandler(handler)
    return stream.getvalue()


def test_fp16_overflow_line_is_logged_on_rank_0_only(dist_pool):
    rank0, rank1 = dist_pool.run(_overflow_logged)
    assert "OVERFLOW! Rank 0 Skipping step. Attempted loss scale: 8.0, reducing to 4.0" in rank0
    assert "OVERFLOW" not in rank1


def test_fp16_static_scale_stays_and_still_skips(dist_pool):
    results = dist_pool.run(_train, args=({"fp16": {"enabled": True, "loss_scale": 32}},
                                          1, None, (2,)))
    for r in results:
        assert r["scales"] == [32.0] * STEPS and r["skipped"] == 1
        assert r["unchanged"] == [False, False, True, False]


def test_fp16_without_overflow_tracks_fp32(dist_pool):
    results = dist_pool.run(_train, args=({"fp16": {"enabled": True}}, 2))
    reference = fp32_reference(2)
    for r in results:
        assert r["skipped"] == 0 and _max_diff(r["masters"], reference) < 5e-3


def _comm_bytes(extra):
    import deepspeed
    from deepspeed import comm as dist

    seen = []
    observer = seen.append
    dist.add_comm_observer(observer)
    try:
        engine, *_ = deepspeed.initialize(model=make_model(), config={
            "train_micro_batch_size_per_gpu": 2, "bf16": {"enabled": True},
            "optimizer": {"type": "SGD", "params": {"lr": 0.1}}, **extra})
        engine.backward(engine(torch.ones(2, 8, dtype=torch.bfloat16)).float().sum())
    finally:
        dist.remove_comm_observer(observer)
    numel = sum(p.numel() for p in engine.module.parameters())
    return [r.size_bytes for r in seen if r.op == "all_reduce"], numel


def test_communication_data_type_sets_the_reduction_dtype(dist_pool):
    sizes, numel = dist_pool.run(_comm_bytes, args=({},))[0]
    assert sizes == [2 * numel]  # bf16 gradients reduced in bf16
    sizes, numel = dist_pool.run(_comm_bytes, args=({"communication_data_type": "fp32"},))[0]
    assert sizes == [4 * numel]


def test_mixed_precision_state_dict_round_trip():
    from deepspeed.precision import DynamicLossScaler, MixedPrecisionOptimizer

    model = make_model().to(torch.bfloat16)
    opt = MixedPrecisionOptimizer(torch.optim.Adam(model.parameters(), lr=0.1),
                                  loss_scaler=DynamicLossScaler(init_scale=8))
    model(torch.ones(1, 8, dtype=torch.bfloat16)).sum().backward()
    assert opt.unscale_grads()
    opt.step()
    opt.update_scale(True)
    state = opt.state_dict()
    other_model = make_model().to(torch.bfloat16)
    other = MixedPrecisionOptimizer(torch.optim.Adam(other_model.parameters(), lr=0.1),
                                    loss_scaler=DynamicLossScaler(init_scale=1024))
    other.load_state_dict(state)
    assert other.cur_scale == opt.cur_scale
    for a, b in zip(opt.master_params(), other.master_params()):
        assert torch.equal(a, b)
    for a, b in zip(model.parameters(), other_model.parameters()):
        assert torch.equal(a, b)


def _no_sync_keeps_local_grads():
    import deepspeed
    from deepspeed import comm as dist

    engine, *_ = deepspeed.initialize(model=make_model(), config={
        "train_micro_batch_size_per_gpu": 2, "optimizer": {"type": "SGD", "params": {"lr": 0.1}}})
    x = torch.full((2, 8), float(dist.get_rank() + 1))
    with engine.no_sync():
        engine.backward(engine(x).sum())
    local = [p.grad.clone() for p in engine.module.parameters()]
    engine.module.zero_grad()
    engine.backward(engine(x).sum())
    reduced = [p.grad.clone() for p in engine.module.parameters()]
    return local, reduced


def test_no_sync_skips_the_reduction(dist_pool):
    (local0, reduced0), (local1, reduced1) = dist_pool.run(_no_sync_keeps_local_grads)
    assert not all(torch.equal(a, b) for a, b in zip(local0, local1))
    for a, b, r0, r1 in zip(local0, local1, reduced0, reduced1):
        torch.testing.assert_close(r0, (a + b) / 2)
        assert torch.equal(r0, r1)


def _progress_lines(extra):
    import io

    import deepspeed
    from deepspeed.utils.logging import logger

    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    logger.addHandler(handler)
    try:
        engine, *_ = deepspeed.initialize(model=make_model(), config={
            "train_micro_batch_size_per_gpu": 2, "steps_per_print": 2,
            "optimizer": {"type": "SGD", "params": {"lr": 0.1}}, **extra})
        for _ in range(4):
            engine.backward(engine(torch.ones(2, 8)).sum())
            engine.step()
    finally:
        logger.removeHandler(handler)
    return stream.getvalue()


def test_steps_per_print_and_wall_clock_breakdown(dist_pool):
    plain = dist_pool.run(_progress_lines, args=({},))[0]
    assert plain.count("step=") == 2 and "samples/sec=" in plain and "loss=" in plain
    # a loss a person reads: four significant digits, not a float's seventeen
    for loss in re.findall(r"loss=(\S+),", plain):
        assert len(re.sub(r"e.*|\D", "", loss).lstrip("0")) <= 4, loss
    assert "time (ms)" not in plain
    timed = dist_pool.run(_progress_lines, args=({"wall_clock_breakdown": True},))[0]
    assert timed.count("time (ms) | forward:") == 2
    assert "backward_allreduce:" in timed and "step:" in timed


def _amp_without_apex():
    import deepspeed

    deepspeed.initialize(model=make_model(), config={
        "train_micro_batch_size_per_gpu": 2, "amp": {"enabled": True, "opt_level": "O1"},
        "optimizer": {"type": "SGD", "params": {"lr": 0.1}}})


def test_amp_without_apex_is_a_clear_error(dist_pool):
    pytest.importorskip("torch")
    try:
        import apex  # noqa: F401
        pytest.skip("apex is installed here")
    except ImportError:
        pass
    for message in dist_pool.run(error_of, args=(_amp_without_apex,)):
        assert message is not None and "needs NVIDIA apex" in message


def _excluded_parameter_grads():
    import deepspeed

    model = make_model()
    excluded = model[0].bias  # left out of model_parameters: trained by nobody, still gets grads
    owned = [p for p in model.parameters() if p is not excluded]
    engine, *_ = deepspeed.initialize(model=model, model_parameters=owned, config={
        "train_micro_batch_size_per_gpu": MICRO, "bf16": {"enabled": True},
        "optimizer": {"type": "SGD", "params": {"lr": 0.1}}})
    x = torch.ones(MICRO, 8, dtype=torch.bfloat16)
    seen = []
    for _ in range(3):
        engine.backward(engine(x).float().sum())
        seen.append(engine.module[0].bias.grad is not None)
        engine.step()
        seen.append(engine.module[0].bias.grad)
    return seen


def test_mixed_precision_step_clears_grads_of_parameters_it_does_not_own(dist_pool):
    seen = dist_pool.run(_excluded_parameter_grads)[0]
    assert seen[0::2] == [True, True, True]  # backward reaches the excluded parameter...
    assert seen[1::2] == [None, None, None]  # ...and every step clears it, as torch's would
