"""WarmupLR / WarmupDecayLR / WarmupCosineLR against the documented formulas.

The expected values are computed here from the API reference's formulas (W = max(2, steps);
log warmup gamma = log(i+1)/log(W), linear gamma = i/W; linear decay (T-i)/(T-W); cosine
cos_min + (1-cos_min)(1+cos(pi*s/n))/2), independently of the implementation.
"""
import math

import pytest

from deepspeed.lr_schedules import WarmupCosineLR, WarmupDecayLR, WarmupLR

STEPS = 50


def warmup_gamma(i, warmup, kind):
    w = max(2, warmup)
    if i >= w:
        return 1.0
    return math.log(i + 1) / math.log(w) if kind == "log" else i / w


def decay_gamma(i, warmup, total, kind):
    w = max(2, warmup)
    if i < w:
        return warmup_gamma(i, warmup, kind)
    return max(0.0, (total - i) / max(1, total - w))


def cosine_ratio(i, warmup, total, min_ratio, cos_min, kind):
    w = max(2, warmup)
    if i < w:
        return min_ratio + warmup_gamma(i, warmup, kind) * (1 - min_ratio)
    s, n = i - w + 1, total - w
    return max(0.0, cos_min + (1 - cos_min) * (1 + math.cos(math.pi * s / n)) / 2)


def run(scheduler, optimizer, train, steps=STEPS):
    """lr per group after each step(), read back from the optimizer that torch steps."""
    seen = []
    for _ in range(steps):
        train(optimizer)
        scheduler.step()
        seen.append([g["lr"] for g in optimizer.param_groups])
        assert scheduler.get_last_lr() == seen[-1]
    return seen


# ---------------------------------------------------------------------------- WarmupLR
@pytest.mark.parametrize("kind", ["log", "linear"])
def test_warmup_lr_first_50_values_per_group(make_opt, train, kind):
    mins, maxs, warmup = [0.002, 0.0], [0.01, 0.05], 20
    opt = make_opt("adamw", lrs=(0.3, 0.7))
    sched = WarmupLR(opt, warmup_min_lr=mins, warmup_max_lr=maxs, warmup_num_steps=warmup,
                     warmup_type=kind)
    assert [g["lr"] for g in opt.param_groups] == [0.3, 0.7]  # the constructor leaves lr alone
    seen = run(sched, opt, train)
    for i, lrs in enumerate(seen):
        gamma = warmup_gamma(i, warmup, kind)
        assert lrs == pytest.approx([lo + (hi - lo) * gamma for lo, hi in zip(mins, maxs)],
                                    rel=1e-12, abs=1e-15), i
    if kind == "log":  # log warmup reaches the max one batch before the warmup ends
        assert seen[warmup - 1] == pytest.approx(maxs)
    assert seen[warmup] == pytest.approx(maxs) and seen[-1] == pytest.approx(maxs)


def test_warmup_lr_appendix_cross_check(make_opt):
    opt = make_opt()
    sched = WarmupLR(opt, warmup_max_lr=0.01, warmup_num_steps=10)
    got = {}
    for _ in range(12):
        sched.step()
        got[sched.last_batch_iteration] = sched.get_last_lr()[0]
    assert got[0] == 0.0 and got[1] == pytest.approx(0.0030103, abs=1e-7)
    assert got[4] == pytest.approx(0.0069897, abs=1e-7) and got[9] == pytest.approx(0.01)
    assert got[11] == pytest.approx(0.01)
    opt2 = make_opt(lrs=(0.1, 0.1))
    sched2 = WarmupLR(opt2, [0.0, 0.001], [0.01, 0.02], warmup_num_steps=4, warmup_type="linear")
    sched2.step()
    sched2.step()
    assert sched2.get_last_lr() == pytest.approx([0.0025, 0.00575])


@pytest.mark.parametrize("steps", [0, 1, 2])
def test_warmup_steps_below_two_are_clamped(make_opt, steps):
    sched = WarmupLR(make_opt(), warmup_max_lr=1.0, warmup_num_steps=steps, warmup_type="linear")
    values = []
    for _ in range(4):
        sched.step()
        values.append(sched.get_last_lr()[0])
    assert values == [0.0, 0.5, 1.0, 1.0]


def test_warmup_lr_before_first_step_warns_and_returns_zero(make_opt, ds_warnings):
    opt = make_opt(lrs=(0.1, 0.2))
    sched = WarmupLR(opt)
    assert sched.get_lr() == [0.0]
    assert any("before the first step" in m for m in ds_warnings)
    with pytest.raises(AssertionError, match="need to call step\\(\\) first"):
        sched.get_last_lr()


def test_unknown_warmup_type_warns_and_uses_log(make_opt, ds_warnings):
    sched = WarmupLR(make_opt(), warmup_max_lr=0.01, warmup_num_steps=10, warmup_type="cubic")
    assert sched.warmup_type == "log"
    assert any("'cubic'" in m and "log" in m for m in ds_warnings)
    for _ in range(3):
        sched.step()
    assert sched.get_last_lr()[0] == pytest.approx(0.01 * math.log(3) / math.log(10))


@pytest.mark.parametrize("key,value,message", [
    ("warmup_num_steps", -1, "warmup_num_steps must be a non-negative integer, got -1"),
    ("warmup_num_steps", "auto", "warmup_num_steps must be a non-negative integer, got 'auto'"),
    ("warmup_num_steps", 2.5, "warmup_num_steps must be a non-negative integer, got 2.5"),
    ("warmup_max_lr", "auto", "warmup_max_lr must be a number, got 'auto'"),
    ("warmup_max_lr", [0.1, 0.2, 0.3], "expected 2 value for warmup_max_lr, got \\[0.1, 0.2"),
    ("warmup_min_lr", [0.1], "expected 2 value for warmup_min_lr, got \\[0.1\\]"),
    ("last_batch_iteration", -2, "last_batch_iteration must be an integer >= -1, got -2"),
])
def test_warmup_lr_rejects_bad_values(make_opt, key, value, message):
    with pytest.raises(ValueError, match=message):
        WarmupLR(make_opt(lrs=(0.1, 0.2)), **{key: value})


def test_integral_float_steps_are_accepted(make_opt):
    assert WarmupLR(make_opt(), warmup_num_steps=10.0).warmup_num_steps == 10


# ---------------------------------------------------------------------------- WarmupDecayLR
@pytest.mark.parametrize("kind", ["log", "linear"])
def test_warmup_decay_first_50_values(make_opt, train, kind):
    total, warmup, lo, hi = 40, 10, 0.001, 0.01
    opt = make_opt("adam")
    sched = WarmupDecayLR(opt, total_num_steps=total, warmup_min_lr=lo, warmup_max_lr=hi,
                          warmup_num_steps=warmup, warmup_type=kind)
    seen = [lrs[0] for lrs in run(sched, opt, train)]
    expected = [lo + (hi - lo) * decay_gamma(i, warmup, total, kind) for i in range(STEPS)]
    assert seen == pytest.approx(expected, rel=1e-12, abs=1e-15)
    # boundaries: peak at the end of warmup, the floor at T and after it
    assert seen[warmup] == pytest.approx(hi)
    assert seen[total] == pytest.approx(lo) and seen[total + 5] == pytest.approx(lo)
    assert seen[(warmup + total) // 2] == pytest.approx((lo + hi) / 2)


def test_warmup_decay_appendix_cross_check(make_opt):
    sched = WarmupDecayLR(make_opt(), 20, warmup_max_lr=0.01, warmup_num_steps=10,
                          warmup_type="linear")
    got = []
    for _ in range(24):
        sched.step()
        got.append(sched.get_last_lr()[0])
    assert got[:11] == pytest.approx([0.001 * i for i in range(11)])
    assert got[11] == pytest.approx(0.009) and got[15] == pytest.approx(0.005)
    assert got[20:] == pytest.approx([0.0] * 4)


def test_warmup_decay_total_below_warmup_only_warns(make_opt, ds_warnings):
    sched = WarmupDecayLR(make_opt(), total_num_steps=5, warmup_num_steps=10,
                          warmup_type="linear", warmup_max_lr=1.0)
    assert any("total_num_steps 5 is less than warmup_num_steps 10" in m for m in ds_warnings)
    sched.step(last_batch_iteration=12)
    assert sched.get_last_lr() == [0.0]


def test_warmup_decay_requires_positive_total(make_opt):
    with pytest.raises(ValueError, match="total_num_steps must be a positive integer, got 0"):
        WarmupDecayLR(make_opt(), total_num_steps=0)


# ---------------------------------------------------------------------------- WarmupCosineLR
@pytest.mark.parametrize("kind,min_ratio", [("linear", 0.0), ("log", 0.1)])
def test_warmup_cosine_first_50_values_scale_each_group(make_opt, train, kind, min_ratio):
    total, warmup, cos_min, base = 40, 10, 1e-3, (0.1, 0.03)
    opt = make_opt("adamw", lrs=base)
    sched = WarmupCosineLR(opt, total_num_steps=total, warmup_min_ratio=min_ratio,
                           warmup_num_steps=warmup, cos_min_ratio=cos_min, warmup_type=kind)
    assert [g["lr"] for g in opt.param_groups] == list(base)  # untouched by the constructor
    seen = run(sched, opt, train)
    for i, lrs in enumerate(seen):
        ratio = cosine_ratio(i, warmup, total, min_ratio, cos_min, kind)
        assert lrs == pytest.approx([b * ratio for b in base], rel=1e-12, abs=1e-15), i
    last_warmup = 1.0 if kind == "log" else min_ratio + (warmup - 1) / warmup
    assert seen[warmup - 1] == pytest.approx([b * last_warmup for b in base])
    assert seen[total - 1] == pytest.approx([b * cos_min for b in base])  # end of the cosine
    assert seen[total] > seen[total - 1]                       # no clamp: it rises again
    sched.step(last_batch_iteration=2 * total - warmup - 1)    # a full period later: ratio 1
    assert sched.get_last_lr() == pytest.approx(list(base))


def test_warmup_cosine_appendix_cross_check(make_opt):
    sched = WarmupCosineLR(make_opt(), 20, warmup_num_steps=10, warmup_type="linear")
    got = []
    for _ in range(30):
        sched.step()
        got.append(sched.get_last_lr()[0])
    assert got[:10] == pytest.approx([0.01 * i for i in range(10)])
    for i, value in {10: 0.09755307, 11: 0.0904518, 14: 0.050005, 19: 1e-05,
                     20: 0.00245693, 29: 0.1}.items():
        assert got[i] == pytest.approx(value, rel=1e-6), i
    log_sched = WarmupCosineLR(make_opt(), 20, warmup_min_ratio=0.1, warmup_num_steps=10)
    log_sched.step()
    log_sched.step()
    assert log_sched.get_last_lr()[0] == pytest.approx(0.0370927, rel=1e-6)


def test_warmup_cosine_per_group_min_ratio(make_opt):
    opt = make_opt(lrs=(1.0, 2.0))
    sched = WarmupCosineLR(opt, 20, warmup_min_ratio=[0.5, 0.0], warmup_num_steps=4,
                           warmup_type="linear")
    sched.step()
    assert sched.get_last_lr() == pytest.approx([0.5, 0.0])


def test_warmup_cosine_bad_warmup_type_raises(make_opt):
    with pytest.raises(ValueError, match="warmup_type must be one of \\['log', 'linear'\\]"):
        WarmupCosineLR(make_opt(), 100, warmup_type="cubic")
    with pytest.raises(UnboundLocalError):  # the exception type upstream surfaced
        WarmupCosineLR(make_opt(), 100, warmup_type="cubic")


def test_warmup_cosine_total_below_warmup_warns(make_opt, ds_warnings):
    WarmupCosineLR(make_opt(), total_num_steps=3, warmup_num_steps=10)
    assert any("total_num_steps 3 is less than warmup_num_steps 10" in m for m in ds_warnings)
