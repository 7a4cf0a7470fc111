"""LRRangeTest against the documented formula lr = min_lr * (1 + rate * interval), with
interval = (i+1)/step_size, or floor((i+1)/step_size) in staircase mode."""
import math

import pytest

from deepspeed.lr_schedules import LRRangeTest

STEPS = 50


def expected_lr(i, min_lr, size, rate, staircase):
    interval = (i + 1) / size
    if staircase:
        interval = math.floor(interval)
    return min_lr * (1 + rate * interval)


@pytest.mark.parametrize("staircase", [False, True])
def test_first_50_values_per_group(make_opt, train, staircase):
    mins, size, rate = [0.001, 0.01], 7, 2.5
    opt = make_opt("adamw", lrs=(0.5, 0.6))
    sched = LRRangeTest(opt, lr_range_test_min_lr=mins, lr_range_test_step_size=size,
                        lr_range_test_step_rate=rate, lr_range_test_staircase=staircase)
    assert [g["lr"] for g in opt.param_groups] == mins  # starts from the floor
    seen = []
    for i in range(STEPS):
        train(opt)
        sched.step()
        seen.append([g["lr"] for g in opt.param_groups])
        assert sched.last_batch_iteration == i
        assert seen[-1] == pytest.approx([expected_lr(i, m, size, rate, staircase) for m in mins],
                                         rel=1e-12)
        assert sched.get_last_lr() == seen[-1]
    if staircase:  # flat inside a stair, a jump of rate*min_lr where (i+1) hits a multiple of size
        assert seen[size - 2] == seen[0]
        assert seen[size - 1][0] == pytest.approx(mins[0] * (1 + rate))
        assert seen[2 * size - 2] == seen[size - 1]
    else:
        assert seen[1][0] - seen[0][0] == pytest.approx(mins[0] * rate / size)


def test_appendix_cross_check(make_opt):
    sched = LRRangeTest(make_opt(), lr_range_test_min_lr=0.001, lr_range_test_step_size=5)
    got = []
    for _ in range(12):
        sched.step()
        got.append(sched.get_last_lr()[0])
    assert got[:5] == pytest.approx([0.0012, 0.0014, 0.0016, 0.0018, 0.0020])
    assert got[11] == pytest.approx(0.0034)
    stairs = LRRangeTest(make_opt(), 0.001, 5, 2, True)
    got = []
    for _ in range(12):
        stairs.step()
        got.append(stairs.get_last_lr()[0])
    assert got == pytest.approx([0.001] * 4 + [0.003] * 5 + [0.005] * 3)


def test_step_jumps_to_a_batch(make_opt):
    opt = make_opt()
    sched = LRRangeTest(opt, lr_range_test_min_lr=0.002, lr_range_test_step_size=10)
    sched.step(batch_iteration=99)
    assert sched.last_batch_iteration == 99
    assert opt.param_groups[0]["lr"] == pytest.approx(0.002 * (1 + 100 / 10))
    sched.step()
    assert sched.last_batch_iteration == 100


def test_defaults_match_the_docs(make_opt):
    sched = LRRangeTest(make_opt())
    assert (sched.min_lr, sched.step_size, sched.step_rate, sched.staircase) == \
        ([1e-3], 2000, 1.0, False)
    assert sched.last_batch_iteration == -1


@pytest.mark.parametrize("kwargs,message", [
    ({"lr_range_test_min_lr": [0.1, 0.2, 0.3]}, "expected 2 lr_range_test_min_lr, got 3"),
    ({"lr_range_test_step_size": 0}, "lr_range_test_step_size must be a positive integer, got 0"),
    ({"lr_range_test_step_rate": "fast"}, "lr_range_test_step_rate must be a number"),
    ({"lr_range_test_staircase": "yes"}, "lr_range_test_staircase must be true or false"),
])
def test_rejects_bad_values(make_opt, kwargs, message):
    with pytest.raises(ValueError, match=message):
        LRRangeTest(make_opt(lrs=(0.1, 0.2)), **kwargs)
