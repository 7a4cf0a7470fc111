"""0/1 Adam on 2 gloo ranks with small scalers: the variance moves only at the documented steps,
local steps send nothing, synchronisations land at the documented gaps, replicas agree there."""
import pytest
import torch

from deepspeed.testing.distributed import run_distributed

from onebit_training import (MICRO, config, data, engine, eval_loss, identical_on_all_ranks,
                              masters, train)

VAR_FREEZE, KAPPA, ALPHA, CLIPPER, STEPS = 12, 2, 2, 4, 32


def _documented_variance_steps():
    """t_0 = 1, t_{j+1} = t_j + 2^floor(j / kappa), up to var_freeze_step."""
    steps, t, j = [], 1, 0
    while t <= VAR_FREEZE:
        steps.append(t)
        t, j = t + 2 ** (j // KAPPA), j + 1
    return steps


def _documented_sync_steps():
    """From var_freeze_step, gaps min(2^floor(j / alpha), clipper): 1, 1, 2, 2, 4, 4, 4, ..."""
    steps, t, j = [], VAR_FREEZE, 0
    while True:
        t, j = t + min(2 ** (j // ALPHA), CLIPPER), j + 1
        if t > STEPS:
            return steps
        steps.append(t)


def _run():
    from deepspeed import comm as dist

    x, y = data(STEPS, dist.get_world_size())
    eng = engine(config("ZeroOneAdam", lr=1e-2, var_freeze_step=VAR_FREEZE,
                        var_update_scaler=KAPPA, local_step_scaler=ALPHA,
                        local_step_clipper=CLIPPER))
    opt = eng.basic_optimizer
    seen = {"v": [opt.state[p]["exp_avg_sq"].clone() if p in opt.state else None
                  for p in masters(eng)]}
    variance_moved, identical_at = [], {}

    def on_step(step, e):
        now = [opt.state[p]["exp_avg_sq"] for p in masters(e)]
        if any(old is None or not torch.equal(old, new) for old, new in zip(seen["v"], now)):
            variance_moved.append(step)
        seen["v"] = [t.clone() for t in now]
        identical_at[step] = identical_on_all_ranks(list(e.module.parameters()))

    before = eval_loss(eng, x, y)
    history = train(eng, STEPS, x, y, on_step=on_step)
    return {"variance_moved": variance_moved,
            "ops": [[op for op, _ in ops] for _, ops in history],
            "identical_at": identical_at, "losses": (before, eval_loss(eng, x, y))}


def test_policies_and_communication():
    variance = _documented_variance_steps()
    syncs = _documented_sync_steps()
    assert variance == [1, 2, 3, 5, 7, 11]
    assert [b - a for a, b in zip([VAR_FREEZE] + syncs, syncs)] == [1, 1, 2, 2, 4, 4, 4]
    compressed = ["all_to_all_single", "all_gather", "all_gather", "all_gather"]
    for result in run_distributed(_run, world_size=2):
        assert result["variance_moved"] == variance
        for step, ops in enumerate(result["ops"], start=1):
            if step in variance:
                assert ops == ["all_reduce"], step  # the engine's full-precision gradients
            elif step <= VAR_FREEZE or step in syncs:
                assert ops == compressed, step  # 1-bit gradients, or the 1-bit sync
            else:
                assert ops == [], step  # a local step: nothing on the wire
        for step in syncs:
            assert result["identical_at"][step], step
        local = [s for s in range(VAR_FREEZE + 1, STEPS + 1) if s not in syncs]
        assert local and not all(result["identical_at"][s] for s in local)
        assert result["losses"][1] < result["losses"][0]


def test_documented_defaults_and_policy_helpers():
    import inspect

    from deepspeed.onebit import ZeroOneAdam
    from deepspeed.onebit.schedules import SyncSchedule, variance_steps

    defaults = {k: v.default for k, v in inspect.signature(ZeroOneAdam).parameters.items()}
    assert defaults["var_freeze_step"] == 100000 and defaults["var_update_scaler"] == 16
    assert defaults["local_step_scaler"] == 32678 and defaults["local_step_clipper"] == 16
    assert defaults["comm_backend_name"] == "nccl" and defaults["cuda_aware"] is False
    assert variance_steps(VAR_FREEZE, KAPPA) == _documented_variance_steps()
    schedule = SyncSchedule(VAR_FREEZE, ALPHA, CLIPPER)
    assert [s for s in range(1, STEPS + 1) if schedule.is_sync(s)] == _documented_sync_steps()
    # constant interval policy: local_step_scaler=1 with clipper c syncs every c steps after two
    constant = SyncSchedule(0, 1, 4)
    assert [s for s in range(1, 20) if constant.is_sync(s)] == [1, 3, 7, 11, 15, 19]


@pytest.mark.parametrize("key", ["var_freeze_step", "var_update_scaler", "local_step_scaler",
                                 "local_step_clipper"])
def test_bad_policy_values_named(key):
    assert all(key in msg for msg in run_distributed(_bad_policy, world_size=2, args=(key,)))


def _bad_policy(key):
    from deepspeed.onebit import ZeroOneAdam

    try:
        ZeroOneAdam([torch.nn.Parameter(torch.zeros(2))], **{key: 0})
    except ValueError as exc:
        return str(exc)
    return ""


def _dead_input_regression():
    """Linear regression whose first input feature is always 0: that weight column never gets a
    gradient (``v`` stays 0) but its momentum picks up 1-bit noise during the compressed warm-up,
    as a key bias or an unused token embedding does in a real model."""
    from deepspeed import comm as dist

    freeze, steps = 10, 40
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(steps * MICRO * dist.get_world_size(), 8, generator=gen)
    x[:, 0] = 0.0
    y = x @ torch.randn(8, 4, generator=gen) + 0.01 * torch.randn(len(x), 4, generator=gen)
    torch.manual_seed(0)
    eng = engine(config("ZeroOneAdam", lr=3e-2, var_freeze_step=freeze, var_update_scaler=2,
                        local_step_scaler=2, local_step_clipper=4), net=torch.nn.Linear(8, 4))
    schedule = eng.basic_optimizer.sync_schedule
    losses, agree = {}, {}

    def on_step(step, e):
        if step == freeze or step == steps:
            losses[step] = eval_loss(e, x, y)
        if step > freeze and schedule.is_sync(step):
            agree[step] = identical_on_all_ranks(list(e.module.parameters()))

    train(eng, steps, x, y, on_step=on_step)
    return losses[freeze], losses[steps], agree


def test_local_steps_keep_converging_after_the_freeze():
    for at_freeze, final, agree in run_distributed(_dead_input_regression, world_size=2):
        assert final < 0.5 * at_freeze, (at_freeze, final)
        assert len(agree) >= 8 and all(agree.values()), agree
