"""What all five schedules share: resuming (state_dict, last_batch_iteration), param groups with
distinct base lrs, optimizer wrappers, and the optimizer type check."""
import io

import pytest
import torch

from deepspeed.lr_schedules import LRRangeTest, OneCycle, WarmupCosineLR, WarmupDecayLR, WarmupLR

BASE_LRS = (0.1, 0.02)
SCHEDULES = {
    "LRRangeTest": lambda opt, **kw: LRRangeTest(opt, [0.001, 0.004], 7, 2.0, **kw),
    "LRRangeTestStairs": lambda opt, **kw: LRRangeTest(opt, [0.001, 0.004], 7, 2.0, True, **kw),
    "OneCycle": lambda opt, **kw: OneCycle(
        opt, [1e-4, 2e-4], [1e-3, 4e-3], decay_lr_rate=0.1, cycle_first_step_size=8,
        cycle_second_step_size=12, decay_step_size=3, cycle_first_stair_count=4, **kw),
    "WarmupLR": lambda opt, **kw: WarmupLR(opt, [0.0, 0.001], [0.01, 0.03], 10, **kw),
    "WarmupDecayLR": lambda opt, **kw: WarmupDecayLR(opt, 35, [0.0, 0.001], [0.01, 0.03], 10,
                                                     "linear", **kw),
    "WarmupCosineLR": lambda opt, **kw: WarmupCosineLR(opt, 35, 0.1, 10, **kw),
}


def snapshot(opt):
    return [(g["lr"], g.get("betas")) for g in opt.param_groups]


def uninterrupted(make_opt, train, name, steps):
    opt = make_opt("adamw", lrs=BASE_LRS)
    sched = SCHEDULES[name](opt)
    seen = []
    for _ in range(steps):
        train(opt)
        sched.step()
        seen.append(snapshot(opt))
    return seen


@pytest.mark.parametrize("name", sorted(SCHEDULES))
def test_state_dict_round_trip_resumes_the_exact_sequence(make_opt, train, name):
    full = uninterrupted(make_opt, train, name, 50)
    assert len({tuple(s) for s in full}) > 5, "the schedule must actually move"
    assert all(s[0][0] != s[1][0] for s in full[1:]), "groups keep distinct lrs"

    opt = make_opt("adamw", lrs=BASE_LRS)
    sched = SCHEDULES[name](opt)
    for _ in range(20):
        train(opt)
        sched.step()
    buffer = io.BytesIO()
    torch.save(sched.state_dict(), buffer)  # as a checkpoint would store it
    buffer.seek(0)
    state = torch.load(buffer, weights_only=True)
    assert state == {"last_batch_iteration": 19}

    fresh_opt = make_opt("adamw", lrs=BASE_LRS)
    resumed = SCHEDULES[name](fresh_opt)
    resumed.load_state_dict(state)
    assert resumed.last_batch_iteration == 19
    assert snapshot(fresh_opt) == full[19]  # the next optimizer step uses the resumed lr
    assert resumed.get_last_lr() == [lr for lr, _ in full[19]]
    for i in range(20, 50):
        train(fresh_opt)
        resumed.step()
        assert snapshot(fresh_opt) == full[i], i


@pytest.mark.parametrize("name", sorted(SCHEDULES))
def test_constructor_last_batch_iteration_resumes(make_opt, train, name):
    full = uninterrupted(make_opt, train, name, 30)
    opt = make_opt("adamw", lrs=BASE_LRS)
    sched = SCHEDULES[name](opt, last_batch_iteration=14)
    assert sched.last_batch_iteration == 14 and snapshot(opt) == full[14]
    for i in range(15, 30):
        sched.step()
        assert snapshot(opt) == full[i], i


@pytest.mark.parametrize("name", sorted(SCHEDULES))
def test_get_last_lr_needs_a_step_and_state_dict_starts_at_minus_one(make_opt, name):
    sched = SCHEDULES[name](make_opt("adamw", lrs=BASE_LRS))
    assert sched.state_dict() == {"last_batch_iteration": -1}
    with pytest.raises(AssertionError, match="need to call step\\(\\) first"):
        sched.get_last_lr()


def test_load_state_dict_without_counter_is_a_clear_error(make_opt):
    with pytest.raises(KeyError, match="missing 'last_batch_iteration'"):
        WarmupLR(make_opt()).load_state_dict({"step": 3})


class _Wrapper:
    """Stands in for a ZeRO/fp16 wrapper: not a torch Optimizer, exposes one as `.optimizer`."""

    def __init__(self, optimizer):
        self.optimizer = optimizer


@pytest.mark.parametrize("name", sorted(SCHEDULES))
def test_wrapped_optimizer_gets_the_lr(make_opt, name):
    inner = make_opt("adamw", lrs=BASE_LRS)
    sched = SCHEDULES[name](_Wrapper(inner))
    sched.step()
    assert sched.optimizer is inner
    assert [g["lr"] for g in inner.param_groups] == sched.get_last_lr()


@pytest.mark.parametrize("cls", [LRRangeTest, WarmupLR])
def test_non_optimizer_is_a_type_error(cls):
    with pytest.raises(TypeError, match="dict is not a subclass of torch.optim.Optimizer"):
        cls({"lr": 0.1})


def test_sgd_param_groups_follow_each_schedule(make_opt, train):
    opt = make_opt("sgd", lrs=(0.5, 0.05), momentum=0.9)
    sched = WarmupCosineLR(opt, total_num_steps=20, warmup_num_steps=4, warmup_type="linear")
    for _ in range(6):
        train(opt)
        sched.step()
    ratio = sched.get_lr_ratio()[0]
    assert [g["lr"] for g in opt.param_groups] == pytest.approx([0.5 * ratio, 0.05 * ratio])
    assert all(g["momentum"] == 0.9 for g in opt.param_groups)
