"""The autotuning section, the tuning space and the tuners, without launching anything."""
import math
import warnings

import pytest
from pydantic import ValidationError

from deepspeed.autotuning import AutotuningConfig, NothingToTuneError
from deepspeed.autotuning import space as sp
from deepspeed.autotuning.jobs import UserCommand, set_flag
from deepspeed.autotuning.tuner import make_tuner


def test_documented_defaults():
    c = AutotuningConfig()
    assert (c.enabled, c.results_dir, c.exps_dir, c.overwrite, c.metric, c.start_profile_step,
            c.end_profile_step, c.fast, c.max_train_batch_size, c.mp_size,
            c.num_tuning_micro_batch_sizes, c.tuner_type, c.tuner_early_stopping,
            c.tuner_num_trials, c.arg_mappings) == \
        (False, "autotuning_results", "autotuning_exps", False, "throughput", 3, 5, True, None, 1,
         3, "model_based", 5, 50, None)


def test_tutorial_arg_mappings_key_with_trailing_space():
    with pytest.warns(UserWarning, match="'gradient_accumulation_steps ' has surrounding spaces"):
        c = AutotuningConfig(enabled=True, arg_mappings={
            "train_micro_batch_size_per_gpu": "--per_device_train_batch_size",
            "gradient_accumulation_steps ": "--gradient_accumulation_steps"})
    assert c.arg_mappings == {"train_micro_batch_size_per_gpu": "--per_device_train_batch_size",
                              "gradient_accumulation_steps": "--gradient_accumulation_steps"}


@pytest.mark.parametrize("kwargs,needle", [
    ({"metric": "speed"}, "allowed: throughput, latency, FLOPS"),
    ({"tuner_type": "bayes"}, "allowed: gridsearch, random, model_based"),
    ({"start_profile_step": 5, "end_profile_step": 5}, "end_profile_step (5) must be greater"),
    ({"resluts_dir": "x"}, "resluts_dir"),
])
def test_bad_values_name_the_key(kwargs, needle):
    with pytest.raises(ValidationError, match=needle.replace("(", r"\(").replace(")", r"\)")):
        AutotuningConfig(**kwargs)
    assert AutotuningConfig(metric="flops").metric == "FLOPS"


FAST = AutotuningConfig(enabled=True)


def test_nothing_to_tune_names_the_fixed_values():
    config = {"train_micro_batch_size_per_gpu": 4, "zero_optimization": {"stage": 2}}
    with pytest.raises(NothingToTuneError) as info:
        sp.build_space(config, FAST, source="ds_config.json")
    message = str(info.value)
    assert "ds_config.json" in message and "zero_optimization.stage is 2" in message
    assert "train_micro_batch_size_per_gpu is 4" in message and "\"auto\"" in message
    # fast: false opens the stage's ZeRO knobs, so the same config has something to tune
    slow = sp.build_space(config, AutotuningConfig(enabled=True, fast=False))
    assert slow.knob_spaces[2]["overlap_comm"] == [True, False]


def test_user_fixed_values_are_respected_and_auto_is_filled():
    config = {"train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto",
              "train_batch_size": "auto", "zero_optimization": {"stage": 1, "overlap_comm": True},
              "fp16": {"enabled": True}}
    space = sp.build_space(config, FAST)
    assert space.stages == [1] and space.micro_batches is None and space.gas == 1
    point = sp.Point(1, 8, 1)
    exp = sp.experiment_config(config, point, 2, space, {"enabled": True})
    assert exp["train_micro_batch_size_per_gpu"] == 8 and exp["gradient_accumulation_steps"] == 1
    assert exp["train_batch_size"] == 16 and exp["zero_optimization"] == {"stage": 1,
                                                                          "overlap_comm": True}
    assert config["train_micro_batch_size_per_gpu"] == "auto"  # the user's config is untouched
    # a fixed train_batch_size: only micro-batch sizes that divide each rank's share
    space = sp.build_space({"train_batch_size": 24}, FAST)
    mbs, _ = sp.micro_batches_for_stage(space, 0, FAST, None, 2, {})
    assert all(12 % m == 0 for m in mbs) and len(mbs) <= 3
    assert [p.gas for p in sp.points_for_stage(space, 0, mbs, 2)] == [12 // m for m in mbs]


def test_memory_pruning_follows_the_plan():
    """Memory pruning is deepspeed.plan's per-rank peak (model states as each stage partitions
    them, activations, engine buffers) within 90% of the rank's memory, nothing else."""
    from deepspeed.autotuning.planning import MEMORY_HEADROOM, planner_for
    from deepspeed.plan import Layout, memory_per_rank

    info = {"num_params": 10 ** 6, "activation_mem_per_sample": 10 ** 5,
            "memory_per_rank": 30 * 10 ** 6, "param_numels": [250_000] * 4}
    planner = planner_for(info, 4)
    space = sp.build_space({}, FAST)
    fits = [sp.max_micro_batch_for_memory(space, s, planner, 4, {}, 1024) for s in sp.STAGES]
    # stages 1 and 2 free more each; stage 3's prefetch bucket (here the whole model) costs
    # more than its partitioned weights save
    assert fits[0] < fits[1] < fits[2] < 1024 and fits[0] < fits[3] < fits[2]
    for stage, largest in enumerate(fits):  # exactly the plan's largest fitting micro-batch
        peak = [memory_per_rank(planner.spec, Layout(dp=4, zero_stage=stage, micro_batch=m,
                                                     precision="fp32"), planner.cluster).peak
                for m in (largest, largest + 1)]
        budget = info["memory_per_rank"] * MEMORY_HEADROOM
        assert peak[0] <= budget < peak[1], (stage, largest, peak)
    mbs, why = sp.micro_batches_for_stage(space, 0, FAST, planner, 4, {})
    assert mbs[-1] == fits[0] and f"memory estimate allows micro-batch <= {fits[0]}" in why
    tight = planner_for(dict(info, memory_per_rank=10 ** 7), 4)
    assert sp.micro_batches_for_stage(space, 0, FAST, tight, 4, {})[0] == []
    assert sp.spread(1, 1024, 3) == [1, 32, 1024] and sp.spread(4, 4, 3) == [4]
    # the config's precision reaches the plan: fp32 master weights and gradients beside the
    # bf16 ones (20 bytes per parameter, 16 in fp32), and activations kept in half the bytes
    # of the fp32 profile (here they dominate: a larger micro-batch fits)
    bf16 = {"bf16": {"enabled": True}}
    largest = sp.max_micro_batch_for_memory(space, 0, planner, 4, bf16, 1024)
    peak = [memory_per_rank(planner.spec, Layout(dp=4, micro_batch=m, precision="bf16"),
                            planner.cluster).peak for m in (largest, largest + 1)]
    assert largest != fits[0] and peak[0] <= budget < peak[1], (largest, peak)


def test_plan_pruning_keeps_what_is_predicted_close_to_the_best():
    from deepspeed.autotuning.planning import largest_fitting, prune

    predicted = {"a": 100.0, "b": 85.0, "c": 50.0, "d": None}
    kept, skipped = prune(list(predicted), predicted.get, keep_ratio=0.8)
    assert kept == ["a", "b"]
    assert skipped == {"c": "the plan predicts 50% of the best",
                       "d": "the plan's peak memory does not fit"}
    assert prune(list(predicted), predicted.get, keep_ratio=0.5)[0] == ["a", "b", "c"]
    assert largest_fitting(lambda m: m <= 37, 1024) == 37
    assert largest_fitting(lambda m: True, 64) == 64 and largest_fitting(lambda m: False, 64) == 0


def _score(point):  # a made-up landscape: best at stage 1, micro-batch 16
    return -abs(math.log2(point.micro_batch) - 4) - abs(point.stage - 1)


POINTS = [sp.Point(s, m, 1) for s in (0, 1, 2) for m in (1, 2, 4, 8, 16, 32, 64)]


@pytest.mark.parametrize("kind", ["gridsearch", "random", "model_based"])
def test_tuners_find_the_best_point(kind):
    tuner = make_tuner(kind, POINTS, num_trials=50, early_stopping=50)
    results = tuner.tune(_score)
    best = max(results, key=lambda r: r[1])[0]
    assert best == sp.Point(1, 16, 1)
    assert len({p for p, _ in results}) == len(results)  # never runs a point twice
    if kind == "model_based":  # the fitted model goes straight to the optimum
        assert [p for p, _ in results].index(best) <= 8


def test_tuner_stopping_rules():
    grid = make_tuner("gridsearch", POINTS, num_trials=4, early_stopping=50).tune(_score)
    assert [p for p, _ in grid] == POINTS[:4]
    falling = lambda p: -p.micro_batch  # noqa: E731 - the first point is the best
    early = make_tuner("gridsearch", POINTS, num_trials=50, early_stopping=2).tune(falling)
    assert len(early) == 3
    a = make_tuner("random", POINTS, 50, 50).tune(_score)
    b = make_tuner("random", POINTS, 50, 50).tune(_score)
    assert a == b and [p for p, _ in a] != POINTS


def test_arg_mappings_rewrite_the_script_flags():
    command = UserCommand(["--num_gpus", "2"], "run_clm.py",
                          ["--per_device_train_batch_size", "1", "--deepspeed", "ds.json"], 3)
    args = command.with_config("/r/z1/ds_config.json", {"--per_device_train_batch_size": 8,
                                                        "--gradient_accumulation_steps": 2})
    assert args == ["--per_device_train_batch_size", "8", "--deepspeed", "/r/z1/ds_config.json",
                    "--gradient_accumulation_steps", "2"]
    assert set_flag(["--x=1"], "--x", "3") == ["--x=3"]
    assert command.display(args).startswith("deepspeed --num_gpus 2 run_clm.py ")


def test_unchanged_experiment_is_reused_without_overwrite(tmp_path):
    import json

    from deepspeed.autotuning.jobs import run_job

    exp_dir, result = tmp_path / "z0_gas1_tmbspg2", tmp_path / "z0_gas1_tmbspg2" / "metrics.json"
    exp_dir.mkdir()
    config = {"train_micro_batch_size_per_gpu": 2}
    (exp_dir / "ds_config.json").write_text(json.dumps(config))
    result.write_text(json.dumps({"throughput": 12.5}))
    command = UserCommand([], "/nonexistent/script.py", ["--deepspeed", "x.json"], 1)
    reused = run_job(command, "z0_gas1_tmbspg2", config, str(exp_dir), str(result), None,
                     overwrite=False)
    assert reused.reused and reused.metrics == {"throughput": 12.5}
