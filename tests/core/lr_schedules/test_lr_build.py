"""build_lr_scheduler: the config `"scheduler": {"type", "params"}` -> a schedule object;
plus the module constants and the documented `deepspeed.runtime.lr_schedules` path."""
import importlib
import math

import pytest
import torch

import deepspeed.lr_schedules as lr_schedules
from deepspeed.config import DeepSpeedConfigError
from deepspeed.lr_schedules import VALID_LR_SCHEDULES, build_lr_scheduler

CONFIGS = {
    "LRRangeTest": {"lr_range_test_min_lr": 0.0001, "lr_range_test_step_size": 200,
                    "lr_range_test_step_rate": 5, "lr_range_test_staircase": False},
    "OneCycle": {"cycle_first_step_size": 1000, "cycle_first_stair_count": 500,
                 "cycle_second_step_size": 1000, "cycle_second_stair_count": 500,
                 "decay_step_size": 1000, "cycle_min_lr": 0.0001, "cycle_max_lr": 0.0010,
                 "decay_lr_rate": 0.001, "cycle_min_mom": 0.85, "cycle_max_mom": 0.99,
                 "decay_mom_rate": 0.0},
    "WarmupLR": {"warmup_min_lr": 0, "warmup_max_lr": 0.001, "warmup_num_steps": 1000},
    "WarmupDecayLR": {"total_num_steps": 20, "warmup_min_lr": 0, "warmup_max_lr": 1e-3,
                      "warmup_num_steps": 10, "last_batch_iteration": -1},
    "WarmupCosineLR": {"total_num_steps": 100, "warmup_num_steps": 10},
}


def test_valid_schedules_and_constants():
    assert VALID_LR_SCHEDULES == ["LRRangeTest", "OneCycle", "WarmupLR", "WarmupDecayLR",
                                  "WarmupCosineLR"]
    assert (lr_schedules.LR_RANGE_TEST, lr_schedules.ONE_CYCLE, lr_schedules.WARMUP_LR,
            lr_schedules.WARMUP_DECAY_LR, lr_schedules.WARMUP_COSINE_LR) == tuple(
                VALID_LR_SCHEDULES)
    assert (lr_schedules.WARMUP_LOG_RATE, lr_schedules.WARMUP_LINEAR_RATE) == ("log", "linear")
    assert lr_schedules.TOTAL_NUM_STEPS == "total_num_steps"


@pytest.mark.parametrize("name", VALID_LR_SCHEDULES)
def test_builds_each_documented_config(make_opt, name):
    opt = make_opt("adam", lrs=(0.1, 0.05))
    sched = build_lr_scheduler(name, CONFIGS[name], opt)
    assert type(sched) is getattr(lr_schedules, name)
    direct_opt = make_opt("adam", lrs=(0.1, 0.05))
    direct = getattr(lr_schedules, name)(direct_opt, **CONFIGS[name])
    for _ in range(5):
        sched.step()
        direct.step()
    assert sched.get_last_lr() == direct.get_last_lr()
    assert opt.param_groups[0]["lr"] == direct_opt.param_groups[0]["lr"]


def test_hf_style_warmup_decay_matches_the_formula(make_opt):
    """The HF integration's check: log warmup, then linear decay to 0 at total_num_steps."""
    sched = build_lr_scheduler("WarmupDecayLR", CONFIGS["WarmupDecayLR"], make_opt())
    for step in range(21):
        sched.step()
        if step < 10:
            expected = 1e-3 * math.log(step + 1) / math.log(10)
        else:
            expected = 1e-3 * (20 - step) / (20 - 10)
        assert sched.get_last_lr()[0] == pytest.approx(expected, abs=1e-15), step


def test_none_params_means_defaults(make_opt):
    sched = build_lr_scheduler("WarmupLR", None, make_opt())
    assert (sched.warmup_num_steps, sched.max_lrs, sched.warmup_type) == (1000, [0.001], "log")


def test_torch_scheduler_by_name(make_opt):
    opt = make_opt()
    sched = build_lr_scheduler("StepLR", {"step_size": 1, "gamma": 0.5}, opt)
    assert isinstance(sched, torch.optim.lr_scheduler.StepLR)
    for _ in range(3):
        opt.step()
        sched.step()
    assert opt.param_groups[0]["lr"] == pytest.approx(0.1 * 0.5 ** 3)


def test_torch_scheduler_gets_the_unwrapped_optimizer(make_opt):
    inner = make_opt()

    class Wrapper:
        optimizer = inner

    sched = build_lr_scheduler("ExponentialLR", {"gamma": 0.9}, Wrapper())
    assert sched.optimizer is inner


@pytest.mark.parametrize("name,hint", [("WarmUpLR", "Did you mean 'WarmupLR'?"),
                                       ("warmupdecaylr", "Did you mean 'WarmupDecayLR'?"),
                                       ("Optimizer", ""), (None, "")])
def test_unknown_name_is_an_assertion_listing_the_valid_ones(make_opt, name, hint):
    with pytest.raises(AssertionError) as info:
        build_lr_scheduler(name, {}, make_opt())
    message = str(info.value)
    assert f"DeepSpeed does not recognize LR scheduler {name!r}" in message
    assert str(VALID_LR_SCHEDULES) in message and "StepLR" in message
    assert hint in message


def test_unknown_param_key_names_the_path_and_the_closest_key(make_opt):
    with pytest.raises(DeepSpeedConfigError,
                       match="scheduler.params.warmup_max_lrr: not a parameter of WarmupLR; did "
                             "you mean 'warmup_max_lr'"):
        build_lr_scheduler("WarmupLR", {"warmup_max_lrr": 0.1}, make_opt())


@pytest.mark.parametrize("name,params,message", [
    ("WarmupLR", {"warmup_max_lr": "3e-5"}, "scheduler.params.warmup_max_lr: expected a number "
     "(the default is 0.001), got the string '3e-5'; write it without quotes"),
    ("WarmupLR", {"warmup_type": 1}, "scheduler.params.warmup_type: expected a string, got 1"),
    ("StepLR", {"step_size": 2, "gamma": "half"}, "scheduler.params.gamma: expected a number "
     "(the default is 0.1), got 'half', which is not a number"),
])
def test_a_value_of_the_wrong_kind_names_its_key_path(make_opt, name, params, message):
    with pytest.raises(DeepSpeedConfigError) as raised:
        build_lr_scheduler(name, params, make_opt())
    assert message in str(raised.value)


def test_missing_required_param(make_opt):
    with pytest.raises(DeepSpeedConfigError,
                       match="scheduler.params.cycle_max_lr: required by OneCycle but missing"):
        build_lr_scheduler("OneCycle", {"cycle_min_lr": 0.1}, make_opt())


def test_bad_value_is_a_config_error_naming_the_key(make_opt):
    with pytest.raises(DeepSpeedConfigError,
                       match="scheduler.params \\(WarmupDecayLR\\): total_num_steps must be a "
                             "positive integer, got 'auto'"):
        build_lr_scheduler("WarmupDecayLR", {"total_num_steps": "auto"}, make_opt())


def test_params_must_be_a_mapping(make_opt):
    with pytest.raises(DeepSpeedConfigError, match="scheduler.params must be an object"):
        build_lr_scheduler("WarmupLR", [1, 2], make_opt())


def test_documented_runtime_path_reexports_everything():
    compat = importlib.import_module("deepspeed.runtime.lr_schedules")
    names = lr_schedules.__all__ + ["WARMUP_LOG_RATE", "WARMUP_LINEAR_RATE", "LR_RANGE_TEST",
                                    "ONE_CYCLE", "WARMUP_LR", "WARMUP_DECAY_LR",
                                    "WARMUP_COSINE_LR", "LR_RANGE_TEST_MIN_LR"]
    for name in names:
        assert getattr(compat, name) is getattr(lr_schedules, name), name
