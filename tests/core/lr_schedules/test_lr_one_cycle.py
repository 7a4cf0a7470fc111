"""OneCycle against the documented 1Cycle formulas (API reference 1.E and the 1-Cycle tutorial).

The reference below uses the reference's own phrasing (cycle position x against the ratio r =
first/total), not the implementation's, so the two derivations check each other.
"""
import math

import pytest

from deepspeed.lr_schedules import OneCycle

STEPS = 50


def reference(i, lo, hi, first, second, decay_rate, decay_size, min_mom, max_mom, decay_mom):
    """(lr, beta1) after the (i+1)-th step() of a schedule without stairs."""
    total = first + second
    if i < total:
        t = i + 1
        r = first / total
        cycle = math.floor(1 + t / total)
        x = 1 + t / total - cycle
        scale = x / r if x <= r else (x - 1) / (r - 1)
        return lo + (hi - lo) * scale, max_mom - (max_mom - min_mom) * scale
    if decay_size == 0:
        return lo, max_mom
    d = i - total + 1
    return lo / (1 + decay_rate * d / decay_size), max_mom * (1 + decay_mom * d / decay_size)


def stair_reference(i, lo, hi, first, second, stairs1, stairs2, min_mom, max_mom):
    """(lr, beta1) inside the cycle when each half moves in `stairs` equal flat stairs."""
    t = i + 1
    if t <= first:
        scale = math.floor(t / (first / stairs1)) / stairs1
    else:
        scale = 1 - math.floor((t - first) / (second / stairs2)) / stairs2
    return lo + (hi - lo) * scale, max_mom - (max_mom - min_mom) * scale


def test_first_50_values_lr_and_betas_per_group(make_opt, train):
    los, his = [1e-4, 2e-4], [1e-3, 5e-3]
    first, second, decay_size, decay_rate, decay_mom = 12, 18, 4, 0.5, 0.01
    opt = make_opt("adam", lrs=(0.3, 0.3))
    sched = OneCycle(opt, los, his, decay_lr_rate=decay_rate, cycle_first_step_size=first,
                     cycle_second_step_size=second, decay_step_size=decay_size,
                     cycle_min_mom=0.85, cycle_max_mom=0.95, decay_mom_rate=decay_mom)
    # a fresh schedule starts at the lr floor with betas (cycle_min_mom, 0.99)
    assert [g["lr"] for g in opt.param_groups] == los
    assert [g["betas"] for g in opt.param_groups] == [(0.85, 0.99)] * 2
    for i in range(STEPS):
        train(opt)  # torch Adam consumes the written betas tuple
        sched.step()
        for group, lo, hi in zip(opt.param_groups, los, his):
            lr, beta1 = reference(i, lo, hi, first, second, decay_rate, decay_size, 0.85, 0.95,
                                  decay_mom)
            assert group["lr"] == pytest.approx(lr, rel=1e-12), i
            assert group["betas"][0] == pytest.approx(beta1, rel=1e-12), i
            assert group["betas"][1] == 0.99
        assert sched.get_mom() == [g["betas"] for g in opt.param_groups]
    # cycle turns: peak after `first` steps, back to the floor after `first + second`
    sched.step(batch_iteration=first - 1)
    assert sched.get_last_lr() == pytest.approx(his)
    assert opt.param_groups[0]["betas"] == pytest.approx((0.85, 0.99))
    sched.step(batch_iteration=first + second - 1)
    assert sched.get_last_lr() == pytest.approx(los)
    assert opt.param_groups[0]["betas"] == pytest.approx((0.95, 0.99))


def test_no_decay_holds_the_floor_after_the_cycle(make_opt):
    opt = make_opt()
    sched = OneCycle(opt, 0.01, 0.1, decay_lr_rate=0.5, cycle_first_step_size=3)
    for _ in range(20):
        sched.step()
    assert sched.get_last_lr() == pytest.approx([0.01])
    assert opt.param_groups[0]["betas"] == pytest.approx((0.9, 0.99))


def test_tutorial_config_with_stairs(make_opt):
    cfg = dict(cycle_first_step_size=1000, cycle_first_stair_count=500,
               cycle_second_step_size=1000, cycle_second_stair_count=500, decay_step_size=1000,
               cycle_min_lr=0.0001, cycle_max_lr=0.0010, decay_lr_rate=0.001,
               cycle_min_mom=0.85, cycle_max_mom=0.99, decay_mom_rate=0.0)
    opt = make_opt("adam")
    sched = OneCycle(opt, **cfg)
    for i in range(STEPS):
        sched.step()
        lr, beta1 = stair_reference(i, 1e-4, 1e-3, 1000, 1000, 500, 500, 0.85, 0.99)
        assert sched.get_last_lr()[0] == pytest.approx(lr, rel=1e-12), i
        assert opt.param_groups[0]["betas"][0] == pytest.approx(beta1, rel=1e-12), i
    lrs = {}
    for i in (0, 1, 2, 3, 500, 501, 998, 999, 1000, 1001, 1500, 1999, 2999):
        sched.step(batch_iteration=i)
        lrs[i] = (sched.get_last_lr()[0], opt.param_groups[0]["betas"][0])
        if i < 2000:
            expected = stair_reference(i, 1e-4, 1e-3, 1000, 1000, 500, 500, 0.85, 0.99)
            assert lrs[i] == pytest.approx(expected, rel=1e-12), i
    assert lrs[0] == pytest.approx((1e-4, 0.99))          # momentum 0.99 at step 0
    assert lrs[1] == lrs[2] and lrs[1] != lrs[0]           # 500 stairs: a change every 2 steps
    assert lrs[999] == pytest.approx((1e-3, 0.85))         # peak lr, lowest momentum
    assert lrs[1000] == lrs[999]                           # the top stair spans the turn
    assert lrs[1001] == pytest.approx(lrs[998]) and lrs[1001] != lrs[1000]
    assert lrs[1999][0] == pytest.approx(1e-4)             # end of the cycle
    assert lrs[2999][0] == pytest.approx(1e-4 / (1 + 0.001 * 1000 / 1000))  # decay phase


def test_sgd_has_no_betas_so_momentum_is_not_cycled(make_opt, ds_warnings):
    opt = make_opt("sgd", lrs=(0.1,), momentum=0.9)
    sched = OneCycle(opt, 0.0001, 0.0010, cycle_first_step_size=10)
    assert sched.cycle_momentum is False and sched.get_mom() is None
    assert any("cycle_momentum is disabled" in m and "SGD" in m for m in ds_warnings)
    for _ in range(5):
        sched.step()
    assert sched.get_last_lr()[0] == pytest.approx(0.0001 + 0.0009 * 5 / 10)
    assert opt.param_groups[0]["momentum"] == 0.9 and "betas" not in opt.param_groups[0]


def test_cycle_momentum_false_leaves_betas(make_opt):
    opt = make_opt("adamw")
    sched = OneCycle(opt, 0.0001, 0.0010, cycle_momentum=False)
    sched.step()
    assert opt.param_groups[0]["betas"] == (0.9, 0.999)


def test_appendix_cross_check(make_opt):
    opt = make_opt()
    sched = OneCycle(opt, 0.0001, 0.0010, cycle_first_step_size=10, decay_step_size=5,
                     decay_lr_rate=0.5, decay_mom_rate=0.1)
    got = []
    for _ in range(26):
        sched.step()
        got.append((sched.get_last_lr()[0], opt.param_groups[0]["betas"][0]))
    assert got[0] == pytest.approx((0.00019, 0.89)) and got[9] == pytest.approx((0.001, 0.8))
    assert got[19] == pytest.approx((0.0001, 0.9))
    assert got[20] == pytest.approx((9.091e-05, 0.918), rel=1e-4)
    assert got[25] == pytest.approx((6.25e-05, 1.008))  # decayed beta1 may exceed 1 (upstream)
    asym = OneCycle(make_opt(), 0.0001, 0.0010, cycle_first_step_size=10,
                    cycle_second_step_size=30)
    for _ in range(13):
        asym.step()
    assert asym.get_last_lr()[0] == pytest.approx(0.00091)


@pytest.mark.parametrize("kwargs,message", [
    ({"cycle_max_lr": [0.1, 0.2, 0.3]}, "expected 2 value for cycle_max_lr"),
    ({"cycle_first_step_size": 0}, "cycle_first_step_size must be a positive integer"),
    ({"cycle_second_step_size": -5}, "cycle_second_step_size must be a positive integer"),
    ({"cycle_first_stair_count": -1}, "cycle_first_stair_count must be a non-negative integer"),
    ({"decay_step_size": "auto"}, "decay_step_size must be a non-negative integer"),
    ({"cycle_momentum": "true"}, "cycle_momentum must be true or false"),
])
def test_rejects_bad_values(make_opt, kwargs, message):
    params = dict(cycle_min_lr=0.001, cycle_max_lr=0.01)
    params.update(kwargs)
    with pytest.raises(ValueError, match=message):
        OneCycle(make_opt(lrs=(0.1, 0.2)), **params)
