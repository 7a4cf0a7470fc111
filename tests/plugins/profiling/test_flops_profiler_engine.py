"""The flops_profiler config section: the engine profiles step ``profile_step`` once, on rank 0."""
import contextlib
import io

import pytest
import torch

from deepspeed.profiling.config import FlopsProfilerConfig
from deepspeed.profiling.flops_profiler import FlopsProfiler, number_to_string
from deepspeed.profiling.plugin import FlopsProfilerPlugin
from tiny_models import mlp

MICRO, IN, HIDDEN, OUT, STEPS = 2, 8, 16, 4, 3


def make_model():
    return mlp(IN, HIDDEN, OUT)


def expected_flops():
    """One forward of make_model() on a (MICRO, IN) batch: each Linear does one MAC per
    (row, input feature, output feature) and 2 flops per MAC (its bias add is not counted), the
    ReLU one flop per element of its (MICRO, HIDDEN) input:
    2 * (2*8*16 + 2*16*4) + 2*16 = 2 * 384 + 32 = 800."""
    macs = MICRO * IN * HIDDEN + MICRO * HIDDEN * OUT  # 256 + 128 = 384
    relu = MICRO * HIDDEN  # 32
    return 2 * macs + relu  # 800


def _train(section, gas=1):
    """Train STEPS steps; return (stdout, start_profile calls, plugin hook calls)."""
    import deepspeed

    calls = {"start": 0, "hook": 0}
    start, in_step = FlopsProfiler.start_profile, FlopsProfilerPlugin._in_profile_step

    def counting_start(self, *args, **kwargs):
        calls["start"] += 1
        return start(self, *args, **kwargs)

    def counting_in_step(self, engine):
        calls["hook"] += 1
        return in_step(self, engine)

    FlopsProfiler.start_profile = counting_start
    FlopsProfilerPlugin._in_profile_step = counting_in_step
    out = io.StringIO()
    try:
        config = {"train_micro_batch_size_per_gpu": MICRO, "gradient_accumulation_steps": gas,
                  "optimizer": {"type": "SGD", "params": {"lr": 0.1}}}
        if section is not None:
            config["flops_profiler"] = section
        with contextlib.redirect_stdout(out):
            engine, _, _, _ = deepspeed.initialize(model=make_model(), config=config)
            for _ in range(STEPS * gas):
                loss = engine(torch.randn(MICRO, IN)).sum()
                engine.backward(loss)
                engine.step()
    finally:
        FlopsProfiler.start_profile = start
        FlopsProfilerPlugin._in_profile_step = in_step
    return out.getvalue(), calls["start"], calls["hook"]


def test_config_defaults_and_validation():
    cfg = FlopsProfilerConfig()
    assert (cfg.enabled, cfg.recompute_fwd_factor, cfg.profile_step, cfg.module_depth,
            cfg.top_modules, cfg.detailed, cfg.output_file) == (False, 0.0, 1, -1, 1, True, None)
    with pytest.raises(Exception, match="profile_step"):
        FlopsProfilerConfig(profile_step=0)
    with pytest.raises(Exception, match="top_module"):
        FlopsProfilerConfig(top_module=3)


def _restored_after_training(section, gas):
    """In a rank process: deepspeed.initialize must not leave a process group in pytest's."""
    from torch.nn import functional as F

    text, starts, hooks = _train(section, gas=gas)
    return text, starts, hooks, not hasattr(F.linear, "__wrapped__")


def test_engine_profiles_the_configured_step_once(dist_pool):
    text, starts, _, restored = dist_pool.run(
        _restored_after_training, world_size=1, args=({"enabled": True, "profile_step": 2}, 2))[0]
    assert starts == 1
    assert text.count("DeepSpeed Flops Profiler") == 1
    assert "Profile Summary at step 2:" in text
    assert f"fwd flops per GPU: {number_to_string(expected_flops())}\n" in text
    for needle in ("world size: 1", "data parallel size: 1", "model parallel size: 1",
                   f"batch size per GPU: {MICRO}", "bwd latency:", "step latency:",
                   "iter latency:", "samples/second:", "Detailed Profile per GPU"):
        assert needle in text, needle
    assert restored  # torch.nn.functional is unpatched after the profiled forward


def test_disabled_plugin_runs_no_hook(dist_pool):
    for section in (None, {"enabled": False, "profile_step": 1}):
        text, starts, hooks, _ = dist_pool.run(_restored_after_training, world_size=1,
                                               args=(section, 1))[0]
        assert (starts, hooks) == (0, 0) and "Flops Profiler" not in text
    _, starts, hooks, _ = dist_pool.run(_restored_after_training, world_size=1,
                                        args=({"enabled": True, "profile_step": 2}, 1))[0]
    assert starts == 1 and hooks == 2  # the counters do see an enabled plugin


def _two_ranks(output_file):
    from deepspeed import comm as dist

    text, starts, _ = _train({"enabled": True, "profile_step": 1, "detailed": False,
                              "output_file": output_file})
    return dist.get_rank(), "Flops Profiler" in text, starts


def test_two_ranks_rank0_writes_output_file(dist_pool, tmp_path):
    target = tmp_path / "flops.txt"
    results = dist_pool.run(_two_ranks, world_size=2, args=(str(target),))
    assert results == [(0, False, 1), (1, False, 0)]  # output_file, not stdout; rank 0 only
    text = target.read_text()
    assert text.count("Profile Summary at step 1:") == 1
    assert "world size: 2" in text and "data parallel size: 2" in text
    assert f"fwd flops per GPU: {number_to_string(expected_flops())}\n" in text
    assert "Detailed Profile" not in text


def test_recompute_fwd_factor_top_modules_depth_and_detail_shape_the_report(dist_pool):
    section = {"enabled": True, "profile_step": 1, "recompute_fwd_factor": 1.0,
               "top_modules": 2}
    text = dist_pool.run(_restored_after_training, world_size=1, args=(section, 1))[0][0]
    plain = dist_pool.run(_restored_after_training, world_size=1,
                          args=({"enabled": True, "profile_step": 1}, 1))[0][0]
    # backward counted as (2 + recompute_fwd_factor) forwards
    def bwd_line(report):
        return next(line for line in report.splitlines() if line.startswith("bwd flops"))

    assert bwd_line(text).startswith("bwd flops per GPU = 3 * fwd flops per GPU")
    assert bwd_line(plain).startswith("bwd flops per GPU = 2 * fwd flops per GPU")
    # top_modules: two module types per depth instead of one ("Linear" and "ReLU" at depth 1)
    assert "params      - {'Linear': '212', 'ReLU': '0'}" in text
    assert "params      - {'Linear': '212'}" in plain
    assert "Detailed Profile per GPU" in plain and "depth 1:" in plain
    brief = dist_pool.run(_restored_after_training, world_size=1, args=(
        {"enabled": True, "profile_step": 1, "detailed": False, "module_depth": 0}, 1))[0][0]
    assert "Detailed Profile per GPU" not in brief and "depth 1:" not in brief
    assert "depth 0:" in brief
