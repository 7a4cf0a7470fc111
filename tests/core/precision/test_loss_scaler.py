"""The dynamic loss scaler against sequences worked out by hand from the documented rules:
start at 2**initial_scale_power; an overflow halves the scale once `hysteresis` overflows have
been absorbed; `loss_scale_window` clean iterations after the last overflow double it and
refill the hysteresis; never below min_loss_scale."""
import pytest

from deepspeed.precision import DynamicLossScaler, LossScaler
from deepspeed.precision.loss_scaler import loss_scaler_from_config

F, T = False, True


def run(scaler, overflows):
    scales = []
    for overflow in overflows:
        scaler.update_scale(overflow)
        scales.append(scaler.cur_scale)
    return scales


def test_window_growth_and_hysteresis():
    scaler = DynamicLossScaler(init_scale=16, scale_window=3, delayed_shift=2)
    #            clean clean clean  ovf  ovf  clean clean clean ovf  clean ovf
    got = run(scaler, [F, F, F, T, T, F, F, F, T, F, T])
    assert got == [16, 16, 32, 32, 16, 16, 16, 32, 32, 32, 16]


def test_consecutive_hysteresis_only_counts_back_to_back_overflows():
    scaler = DynamicLossScaler(init_scale=16, scale_window=3, delayed_shift=2,
                               consecutive_hysteresis=True)
    # the clean step between the two overflows refills the hysteresis, so no halving
    assert run(scaler, [T, F, T, T]) == [16, 16, 16, 8]


def test_without_hysteresis_every_overflow_halves_down_to_the_minimum():
    scaler = DynamicLossScaler(init_scale=8, scale_window=1000, min_scale=2, delayed_shift=1)
    assert run(scaler, [T, T, T, T]) == [4, 2, 2, 2]


def test_raise_at_min_scale_option():
    scaler = DynamicLossScaler(init_scale=1, min_scale=1, raise_error_at_min_scale=True)
    with pytest.raises(RuntimeError, match="already at minimum"):
        scaler.update_scale(True)


def test_state_dict_round_trip_continues_the_sequence():
    a = DynamicLossScaler(init_scale=16, scale_window=3, delayed_shift=2)
    run(a, [F, T, F])
    b = DynamicLossScaler(init_scale=999, scale_window=3, delayed_shift=2)
    b.load_state_dict(a.state_dict())
    pattern = [F, F, T, T, F, F, F]
    assert run(b, pattern) == run(a, pattern)


def test_static_scale_never_moves():
    scaler = LossScaler(128)
    assert run(scaler, [T, F, T]) == [128, 128, 128]


class _Cfg:
    def __init__(self, loss_scale):
        self.dynamic_loss_scale = loss_scale == 0
        self.loss_scale = loss_scale
        self.dynamic_loss_scale_args = {"init_scale": 2.0 ** 5, "scale_window": 7,
                                        "min_scale": 0.5, "delayed_shift": 3,
                                        "consecutive_hysteresis": True}


def test_scaler_from_config():
    dynamic = loss_scaler_from_config(_Cfg(0))
    assert isinstance(dynamic, DynamicLossScaler) and dynamic.cur_scale == 32
    assert (dynamic.scale_window, dynamic.min_scale, dynamic.delayed_shift) == (7, 0.5, 3)
    static = loss_scaler_from_config(_Cfg(64))
    assert type(static) is LossScaler and static.cur_scale == 64
