"""Pacing functions against the formulas of the curriculum-learning tutorial, computed here."""
import math

import pytest

from deepspeed.data_efficiency import CurriculumConfigError, CurriculumScheduler
from deepspeed.data_efficiency.random_ltd import RandomLTDScheduler, consumed_layer_tokens


def reference_root(t, lo, hi, total, step, root):
    d = math.floor((min(t, total) / total) ** (1 / root) * (hi - lo) + lo)
    return min(d - d % step, hi)


def run(config, steps):
    s = CurriculumScheduler(config)
    return [s.update_difficulty(t) for t in steps]


LINEAR = {"min_difficulty": 8, "max_difficulty": 1024, "schedule_type": "fixed_linear",
          "schedule_config": {"total_curriculum_step": 15000, "difficulty_step": 8}}


def test_fixed_linear_documented_points_and_every_step():
    s = CurriculumScheduler(LINEAR)
    assert s.get_difficulty(1) == 8 and s.get_difficulty(7500) == 512
    assert s.get_difficulty(15000) == 1024 and s.get_difficulty(20000) == 1024
    steps = range(1, 15100, 37)
    assert run(LINEAR, steps) == [reference_root(t, 8, 1024, 15000, 8, 1) for t in steps]


def test_fixed_root_degree_2():
    cfg = dict(LINEAR, schedule_type="fixed_root",
               schedule_config={"total_curriculum_step": 15000, "difficulty_step": 8,
                                "root_degree": 2})
    assert CurriculumScheduler(cfg).get_difficulty(3750) == 512  # floor(0.5*1016+8)=516 -> 512
    steps = list(range(1, 16000, 53))
    assert run(cfg, steps) == [reference_root(t, 8, 1024, 15000, 8, 2) for t in steps]


def test_fixed_discrete_documented_sequence():
    cfg = {"min_difficulty": 1, "max_difficulty": 3, "schedule_type": "fixed_discrete",
           "schedule_config": {"difficulty": [1, 2, 3], "max_step": [5, 10]}}
    assert run(cfg, range(1, 14)) == [1] * 5 + [2] * 5 + [3] * 3


def test_custom_schedule_and_missing_function():
    cfg = {"min_difficulty": 2, "max_difficulty": 50, "schedule_type": "custom"}
    s = CurriculumScheduler(cfg)
    with pytest.raises(CurriculumConfigError, match="no schedule function"):
        s.update_difficulty(1)
    seen = []
    s.set_custom_get_difficulty(lambda t: seen.append(t) or min(50, 2 + 3 * t))
    assert [s.update_difficulty(t) for t in range(1, 20)] == [min(50, 2 + 3 * t)
                                                              for t in range(1, 20)]
    assert seen == list(range(1, 17))  # stops asking once the maximum is reached


def test_state_round_trip():
    a = CurriculumScheduler(LINEAR)
    a.update_difficulty(9000)
    b = CurriculumScheduler(LINEAR)
    b.set_state(a.get_state())
    assert b.get_current_difficulty() == a.get_current_difficulty() == \
        reference_root(9000, 8, 1024, 15000, 8, 1)


@pytest.mark.parametrize("schedule_type, config, missing", [
    ("fixed_linear", {"total_curriculum_step": 10}, "difficulty_step"),
    ("fixed_root", {"total_curriculum_step": 10, "difficulty_step": 8}, "root_degree"),
    ("fixed_discrete", {"difficulty": [1, 2]}, "max_step"),
])
def test_missing_schedule_key_is_named(schedule_type, config, missing):
    with pytest.raises(CurriculumConfigError, match=missing):
        CurriculumScheduler({"min_difficulty": 1, "max_difficulty": 9,
                             "schedule_type": schedule_type, "schedule_config": config})


def test_bad_ranges_and_types():
    with pytest.raises(CurriculumConfigError, match="larger than max_difficulty"):
        CurriculumScheduler(dict(LINEAR, min_difficulty=2048))
    with pytest.raises(CurriculumConfigError, match="not a percentile"):
        CurriculumScheduler(dict(LINEAR, min_difficulty=1, max_difficulty=150,
                                 difficulty_type="percentile"))
    with pytest.raises(CurriculumConfigError, match="allowed: fixed_linear"):
        CurriculumScheduler(dict(LINEAR, schedule_type="fixed_cubic"))
    with pytest.raises(CurriculumConfigError, match="one shorter"):
        CurriculumScheduler({"min_difficulty": 1, "max_difficulty": 3,
                             "schedule_type": "fixed_discrete",
                             "schedule_config": {"difficulty": [1, 2, 3], "max_step": [5]}})


LTD = {"total_layer_num": 12, "random_ltd_layer_num": 10,
       "random_ltd_layer_id": list(range(1, 11)),
       "random_ltd_schedule": {"min_value": 128, "max_value": 1024,
                               "schedule_type": "fixed_linear",
                               "schedule_config": {"require_steps": 1000, "seq_per_step": 16}}}


def test_random_ltd_schedule_and_layer_tokens():
    s = RandomLTDScheduler(LTD, global_batch_size=8)
    total = 0
    for t in range(0, 1200, 7):
        r = math.floor(t / 1000 * (1024 - 128) + 128)
        r = min(r - r % 16, 1024)
        assert s.update_seq(t) == r
        s.update_seq(t)  # a second forward of the same step is not counted again
        total += 8 * (r * 10 + 1024 * 2)
    assert s.consumed_layer_tokens == total
    assert consumed_layer_tokens(8, 128, 1024, 10, 12) == 8 * (1280 + 2048)
    clone = RandomLTDScheduler(LTD, global_batch_size=8)
    clone.load_state_dict(s.state_dict())
    assert clone.get_current_seq() == s.get_current_seq()
    assert clone.consumed_layer_tokens == s.consumed_layer_tokens
