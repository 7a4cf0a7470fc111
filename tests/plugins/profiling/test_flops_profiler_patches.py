"""Torch is itself again after the flops profiler stops: every op it wraps
(``deepspeed.profiling.flops_profiler.torch_patches``) is the very object it was before the
profiler was imported, after ``stop_profile``, after a profiled forward that raised (standalone,
``get_model_profile`` and the engine plugin), after a second profiler was refused, and after an
engine whose profiled forward raised is destroyed or garbage-collected.

All scenarios run one after another in one fresh rank that takes the snapshot before importing
``deepspeed.profiling``; each test below checks one scenario's result.
"""
import os
import re
from pathlib import Path

import pytest
import torch

from tiny_models import mlp
from torch_identity import UNPATCHED, Scenarios, run_fresh


README = Path(__file__).parents[3] / "plugins" / "profiling" / "README.md"


class _FailsOnce(torch.nn.Module):
    """An MLP whose first forward raises after its first layer ran (inside the profile)."""

    def __init__(self):
        super().__init__()
        self.net = mlp(4, 8, 2)
        self.failures_left = 1

    def forward(self, x):
        h = self.net[0](x)
        if self.failures_left:
            self.failures_left -= 1
            raise KeyError("forward failed")
        return self.net[2](self.net[1](h))


def _engine(model):
    import deepspeed

    config = {"train_micro_batch_size_per_gpu": 2,
              "optimizer": {"type": "SGD", "params": {"lr": 0.1}},
              "flops_profiler": {"enabled": True, "profile_step": 1, "output_file": os.devnull}}
    engine, *_ = deepspeed.initialize(model=model, config=config)
    return engine


def _hooks(model):
    return sum(len(m._forward_pre_hooks) + len(m._forward_hooks) for m in model.modules())


def _scenarios():
    import gc

    scenarios = Scenarios("deepspeed.profiling")
    check = scenarios.check

    from deepspeed.profiling.flops_profiler import FlopsProfiler, get_model_profile

    x = torch.randn(2, 4)

    model = mlp(4, 8, 2)
    profiler = FlopsProfiler(model)
    profiler.start_profile()
    model(x)
    check("profiling")
    second = mlp(4, 8, 2)
    try:
        FlopsProfiler(second).start_profile()
    except RuntimeError:
        pass
    check("second profiler refused", hooks_on_its_model=_hooks(second))
    profiler.stop_profile()
    check("stopped")
    profiler.end_profile()

    failing = _FailsOnce()
    profiler = FlopsProfiler(failing)
    profiler.start_profile()
    try:
        failing(x)
    except KeyError:
        pass
    finally:
        profiler.stop_profile()
    check("stopped after a forward that raised")
    profiler.end_profile()

    failing = _FailsOnce()
    try:
        get_model_profile(failing, input_shape=(2, 4), warm_up=0, print_profile=False)
    except KeyError:
        pass
    check("get_model_profile raised", hooks_on_its_model=_hooks(failing))

    engine = _engine(mlp(4, 8, 2))
    engine.backward(engine(x).sum())
    engine.step()
    check("engine profiled a step")
    engine.destroy()

    engine = _engine(_FailsOnce())
    try:
        engine(x)
    except KeyError:
        pass
    check("engine forward raised")
    engine.destroy()
    check("engine destroyed after its profiled forward raised")

    engine = _engine(_FailsOnce())
    try:
        engine(x)
    except KeyError:
        pass
    del engine
    gc.collect()
    check("engine garbage-collected after its profiled forward raised")
    return scenarios.results


@pytest.fixture(scope="module")
def results(dist_pool):
    return run_fresh(dist_pool, _scenarios)


@pytest.mark.parametrize("scenario", [
    "stopped", "stopped after a forward that raised", "engine profiled a step",
    "engine destroyed after its profiled forward raised",
    "engine garbage-collected after its profiled forward raised"])
def test_torch_is_unpatched(results, scenario):
    assert results[scenario] == UNPATCHED


def test_get_model_profile_leaves_nothing_when_the_forward_raises(results):
    assert results["get_model_profile raised"] == {**UNPATCHED, "hooks_on_its_model": 0}


def test_the_check_sees_the_wrappers_while_profiling(results):
    profiling = results["profiling"]["differences"]
    for op in ("torch.nn.functional.linear replaced", "torch.matmul replaced",
               "torch.Tensor.__matmul__ added", "torch.Tensor.matmul added"):
        assert op in profiling  # Tensor's ops are inherited: wrapping them adds an entry
    assert results["engine forward raised"]["differences"] == profiling


def test_a_refused_second_profiler_changes_nothing(results):
    refused = results["second profiler refused"]
    assert refused["differences"] == results["profiling"]["differences"]
    assert refused["hooks_on_its_model"] == 0


_OWNERS = {"torch": torch, "torch.Tensor": torch.Tensor,
           "torch.nn.functional": torch.nn.functional}


def _check_listed(listed):
    """Every op the profiler wraps is listed; a listed op it does not wrap is one this torch
    lacks (``op_rules`` skips those)."""
    from deepspeed.profiling.flops_profiler.counting import op_rules

    labels = {owner: label for label, owner in _OWNERS.items()}
    wrapped = {(labels[owner], name) for owner, name, _ in op_rules()}
    assert wrapped <= listed
    assert [op for op in listed - wrapped if hasattr(_OWNERS[op[0]], op[1])] == []


def test_the_readme_lists_the_wrapped_ops():
    rows = re.findall(r"^\| `([\w.]+)` \| (.*) \|$", README.read_text(), re.MULTILINE)
    _check_listed({(owner, name) for owner, names in rows if owner in _OWNERS
                   for name in re.findall(r"`(\w+)`", names)})


def test_the_module_docstring_lists_the_wrapped_ops():
    from deepspeed.profiling.flops_profiler import torch_patches

    bullets = re.findall(r"^- ``([\w.]+)``: (.*?)(?=^- |^$)", torch_patches.__doc__,
                         re.MULTILINE | re.DOTALL)
    _check_listed({(owner, name) for owner, text in bullets
                   for name in re.findall(r"``(\w+)``", text)})
