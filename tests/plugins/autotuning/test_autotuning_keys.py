"""Autotuning keys where the launch tests do not show them, without launching anything: the
micro-batch bounds of the search, the tuner's trial budget and early stop, where the results
and experiment files go, a given model-info file (no profiling run), the probe plugin
switched on by ``metric_path``, and the plan's pruning of the space. Experiments are answered
by a stand-in for ``jobs.run_job``."""
import json

import pytest

from deepspeed.autotuning import AutotuningConfig
from deepspeed.autotuning import space as sp


@pytest.mark.parametrize("section, expected", [
    ({}, [1, 32, 1024]),
    ({"min_train_micro_batch_size_per_gpu": 4, "max_train_micro_batch_size_per_gpu": 64},
     [4, 16, 64]),
    ({"num_tuning_micro_batch_sizes": 2, "max_train_micro_batch_size_per_gpu": 16}, [1, 16]),
    ({"min_train_batch_size": 8, "max_train_batch_size": 64}, [4, 11, 32]),  # 2 ranks
])
def test_micro_batch_bounds_shape_the_search(section, expected):
    config = AutotuningConfig(enabled=True, **section)
    space = sp.build_space({}, config)
    micro, _ = sp.micro_batches_for_stage(space, 0, config, None, 2, {})
    assert micro == expected


def _autotuner(tmp_path, section, scores, stage=0, num_gpus=1):
    from deepspeed.autotuning import autotuner as at
    from deepspeed.autotuning.jobs import JobResult
    from deepspeed.launcher.runner import parse_args

    (tmp_path / "train.py").write_text("")
    config = {"train_micro_batch_size_per_gpu": "auto", "zero_optimization": {"stage": stage},
              "autotuning": dict({"enabled": True}, **section)}
    (tmp_path / "ds.json").write_text(json.dumps(config))
    argv = ["--autotuning", "tune", "--num_gpus", str(num_gpus), str(tmp_path / "train.py"),
            "--deepspeed", str(tmp_path / "ds.json")]
    tuner = at.Autotuner(parse_args(argv), argv)
    ran, overwrites = [], []

    def run_job(command, name, config, exp_dir, result_file, arg_values, overwrite):
        ran.append(name)
        overwrites.append(overwrite)
        score = scores(config["train_micro_batch_size_per_gpu"], config["zero_optimization"]["stage"])
        # latency grows with the micro-batch, so it ranks the points unlike throughput
        return JobResult(name, {"throughput": score, "FLOPS": score,
                                "latency": float(config["train_micro_batch_size_per_gpu"])}, 0,
                         str(tmp_path / "log"))

    at.jobs.run_job, original = run_job, at.jobs.run_job
    tuner.overwrites = overwrites
    return tuner, ran, original


def test_trial_budget_early_stop_directories_and_model_info(tmp_path, monkeypatch):
    from deepspeed.autotuning import autotuner as at

    monkeypatch.chdir(tmp_path)
    info = tmp_path / "info.json"
    info.write_text(json.dumps({"num_params": 10, "activation_mem_per_sample": 0}))
    section = {"results_dir": "res", "exps_dir": "exps", "tuner_type": "gridsearch",
               "tuner_num_trials": 2, "tuner_early_stopping": 50,
               "model_info_path": str(info)}
    tuner, ran, original = _autotuner(tmp_path, section, lambda micro, _stage: micro)
    try:
        tuner.run_search()
        assert len(ran) == 2  # tuner_num_trials; model_info_path: no profiling run
        assert "profile_model_info" not in ran
        assert (tmp_path / "res").is_dir()  # results_dir
        assert sorted(p.name for p in (tmp_path / "exps").iterdir()) == sorted(
            f"{name}.json" for name in ran)  # exps_dir: one experiment description each
        # falling scores: tuner_early_stopping 1 stops after the best plus one worse
        # (and model_info.num_params given instead of a file: no profiling run either)
        section = dict(section, tuner_num_trials=50, tuner_early_stopping=1,
                       model_info={"num_params": 10})
        del section["model_info_path"]
        tuner, ran, _ = _autotuner(tmp_path, section, lambda micro, _stage: 1.0 / micro)
        tuner.run_search()
        assert len(ran) == 2 and "profile_model_info" not in ran
        with pytest.raises(ValueError, match="autotuning.mp_size"):  # 1 rank, mp_size 2
            _autotuner(tmp_path, dict(section, mp_size=2), lambda micro, _stage: 1.0)
    finally:
        at.jobs.run_job = original


def test_metric_chooses_the_best_and_overwrite_reaches_every_job(tmp_path, monkeypatch):
    from deepspeed.autotuning import autotuner as at

    monkeypatch.chdir(tmp_path)
    section = {"tuner_type": "gridsearch", "model_info": {"num_params": 10}}
    try:
        # the stand-in reports throughput = micro-batch, latency = micro-batch
        tuner, _, original = _autotuner(tmp_path, section, lambda micro, _stage: micro)
        assert tuner.run_search()["micro_batch"] == 1024  # most throughput
        assert set(tuner.overwrites) == {False}
        tuner, _, _ = _autotuner(tmp_path, dict(section, metric="latency", overwrite=True),
                                 lambda micro, _stage: micro)
        assert tuner.run_search()["micro_batch"] == 1  # least latency
        assert set(tuner.overwrites) == {True}
    finally:
        at.jobs.run_job = original


def test_metric_path_and_model_info_profile_switch_the_probe_plugin_on():
    from deepspeed.config import DeepSpeedConfig
    from deepspeed.plugin_manager import PluginCatalog

    catalog = PluginCatalog()
    base = {"train_batch_size": 1}
    probed = DeepSpeedConfig(dict(base, autotuning={"enabled": True, "metric_path": "m.json"}),
                             sections=catalog.sections, world_size=1)
    plain = DeepSpeedConfig(dict(base, autotuning={"enabled": True}), sections=catalog.sections,
                            world_size=1)
    profiled = DeepSpeedConfig(dict(base, autotuning={"enabled": True,
                                                       "model_info": {"profile": True}}),
                               sections=catalog.sections, world_size=1)
    assert "autotuning" in catalog.enabled_names(probed)
    assert "autotuning" in catalog.enabled_names(profiled)
    assert "autotuning" not in catalog.enabled_names(plain)


# the demo GPT's profile on two CPU ranks (examples/autotuning: 104,192 parameters; the
# profiling run's stage-0 step at micro-batch 1 took 15.7 ms, mostly the framework's overhead)
DEMO_PROFILE = {"num_params": 104192, "activation_mem_per_sample": 283136,
                "fwd_flops_per_sample": 6_963_200, "bytes_per_param": 4,
                "memory_per_rank": 10 * 2**30,
                "profile_metrics": {"latency": 15.7, "zero_stage": 0,
                                    "train_micro_batch_size_per_gpu": 1,
                                    "gradient_accumulation_steps": 1}}


def _cpu_like(micro, stage):
    """Samples/s of two ranks with a fixed 15 ms per step and 0.7 ms per sample, ZeRO's
    partitioning a little slower at each stage (the shape measured on this machine)."""
    return 2 * micro / (0.015 + 0.0007 * micro * (1 + 0.02 * stage))


def test_plan_pruning_runs_fewer_experiments_for_the_same_best(tmp_path, monkeypatch):
    from deepspeed.autotuning import autotuner as at

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(at.jobs, "run_job", at.jobs.run_job)  # the stand-ins are undone after
    info = tmp_path / "info.json"
    info.write_text(json.dumps(DEMO_PROFILE))
    base = {"tuner_type": "gridsearch", "model_info_path": str(info),
            "max_train_micro_batch_size_per_gpu": 256}
    runs = {}
    for name, section in (("all", base), ("planned", dict(base, plan_pruning=True)),
                          ("loose", dict(base, plan_pruning=True, plan_keep_ratio=0.01))):
        (tmp_path / name).mkdir()
        section = dict(section, results_dir=str(tmp_path / name / "res"))
        tuner, ran, _ = _autotuner(tmp_path / name, section, _cpu_like, stage="auto", num_gpus=2)
        runs[name] = (tuner.run_search()["name"], ran, tuner.pruned)
    best, every, _ = runs["all"]
    assert len(every) == 12 and best == "z0_gas1_tmbspg256"  # 4 stages x [1, 16, 256]
    planned_best, planned, pruned = runs["planned"]
    # the roofline plus the profile's measured overhead predicts micro-batch 1 and 16 at most
    # ~60% of 256's: one experiment per stage is left, and it holds the best
    assert planned_best == best and len(planned) < len(every)
    assert sorted(planned) == [f"z{s}_gas1_tmbspg256" for s in range(4)]
    assert any("z0_gas1_tmbspg16: the plan predicts" in p["reason"] for p in pruned)
    # plan_keep_ratio: a loose ratio keeps every experiment that fits
    assert sorted(runs["loose"][1]) == sorted(every)


def test_tuner_type_chooses_the_order_of_the_experiments(tmp_path, monkeypatch):
    from deepspeed.autotuning import autotuner as at

    monkeypatch.chdir(tmp_path)
    # each _autotuner call stands in for run_job again: monkeypatch restores the real one after
    monkeypatch.setattr(at.jobs, "run_job", at.jobs.run_job)
    orders = {}
    for tuner_type in ("gridsearch", "random"):
        section = {"tuner_type": tuner_type, "tuner_num_trials": 50,
                   "tuner_early_stopping": 50, "model_info": {"num_params": 10}}
        tuner, ran, _ = _autotuner(tmp_path, section, lambda micro, _stage: micro)
        tuner.run_search()
        orders[tuner_type] = ran
    # the same experiments; "random" draws them in a shuffled (seeded) order
    assert sorted(orders["random"]) == sorted(orders["gridsearch"])
    assert orders["random"] != orders["gridsearch"]
