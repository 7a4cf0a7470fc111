"""DeepSpeed's optimizers do not import ``torch._dynamo`` (+72 MiB per rank) when nothing is
compiled, and use torch's dynamo-disabled methods once dynamo is loaded.

The cases run in fresh interpreters (pytest's own process may already have imported dynamo): one
for the two dynamo-free runs, one for the four decorated methods, each shared by its tests (an
interpreter that imports torch is seconds of CPU; the checks themselves are milliseconds).
"""
import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from deepspeed.ops.optimizer_base import DeepSpeedOptimizer

WRAPPED = ("add_param_group", "zero_grad", "state_dict", "load_state_dict")


def _run(code):
    env = dict(os.environ, DS_CPU_OPTIMIZER_FALLBACK="1", MASTER_ADDR="127.0.0.1",
               MASTER_PORT="29517", RANK="0", LOCAL_RANK="0", WORLD_SIZE="1")
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout.strip().splitlines()[-1]


def test_every_builtin_optimizer_uses_the_base():
    from deepspeed.ops.adagrad import DeepSpeedCPUAdagrad
    from deepspeed.ops.adam import DeepSpeedCPUAdam, FusedAdam
    from deepspeed.ops.lamb import FusedLamb
    from deepspeed.ops.lion import DeepSpeedCPULion, FusedLion
    from deepspeed.runtime.fp16.onebit.adam import OnebitAdam

    for cls in (DeepSpeedCPUAdagrad, DeepSpeedCPUAdam, FusedAdam, FusedLamb, DeepSpeedCPULion,
                FusedLion, OnebitAdam):
        assert issubclass(cls, DeepSpeedOptimizer), cls


# Two runs in one interpreter; each reports whether torch._dynamo was loaded after it. The second
# run's answer only means something when the first left dynamo unloaded ("unknown" otherwise).
DYNAMO_FREE_RUNS = """
    import json, sys, torch

    def lifecycle():
        from deepspeed.ops.adam import DeepSpeedCPUAdam
        params = [torch.nn.Parameter(torch.randn(4, 4)), torch.nn.Parameter(torch.randn(4))]
        opt = DeepSpeedCPUAdam(params[:1], lr=0.1)
        opt.add_param_group({"params": params[1:], "lr": 0.01})
        for p in params:
            p.grad = torch.ones_like(p)
        opt.step()
        state = opt.state_dict()
        opt.zero_grad()
        again = DeepSpeedCPUAdam([{"params": [torch.nn.Parameter(params[0].detach().clone())]},
                                  {"params": [torch.nn.Parameter(params[1].detach().clone())],
                                   "lr": 0.01}], lr=0.1)
        again.load_state_dict(state)
        assert all(p.grad is None for p in params)
        assert again.param_groups[1]["lr"] == 0.01
        assert torch.equal(next(iter(again.state.values()))["exp_avg"],
                           next(iter(opt.state.values()))["exp_avg"])

    def engine_step():
        import deepspeed
        model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
        config = {"train_batch_size": 2, "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
                  "zero_optimization": {"stage": 3}}
        engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                          config=config)
        assert type(engine.basic_optimizer).__name__ == "DeepSpeedCPUAdam"
        for _ in range(2):
            engine.backward(engine(torch.randn(2, 8)).sum())
            engine.step()

    lifecycle()
    results = {"lifecycle": "torch._dynamo" in sys.modules}
    engine_step()
    results["engine_step"] = "unknown" if results["lifecycle"] else "torch._dynamo" in sys.modules
    print(json.dumps(results))
"""


@pytest.fixture(scope="module")
def dynamo_free_runs():
    return json.loads(_run(DYNAMO_FREE_RUNS))


def test_optimizer_lifecycle_does_not_import_dynamo(dynamo_free_runs):
    assert dynamo_free_runs["lifecycle"] is False


def test_engine_step_with_the_default_cpu_optimizer_does_not_import_dynamo(dynamo_free_runs):
    assert dynamo_free_runs["engine_step"] is False, dynamo_free_runs


# Every decorated method in one interpreter: each check forgets its own method's cached
# dynamo-disabled function first, so the calls do not see each other's.
DECORATED_CALLS = """
    import json, torch, torch._dynamo
    from deepspeed.ops.adam import DeepSpeedCPUAdam

    results = {}
    for name in NAMES:
        if not hasattr(getattr(torch.optim.Optimizer, name), "__wrapped__"):
            results[name] = None  # this torch does not decorate it
            continue
        param = torch.nn.Parameter(torch.randn(3))
        opt = DeepSpeedCPUAdam([param])
        inner = getattr(torch.optim.Optimizer, name).__wrapped__
        # torch's decorator caches its dynamo-disabled function on the inner one when it runs
        if hasattr(inner, "__dynamo_disable"):
            del inner.__dynamo_disable
        call = {"add_param_group": lambda: opt.add_param_group({"params": [torch.nn.Parameter(torch.randn(2))]}),
                "zero_grad": opt.zero_grad, "state_dict": opt.state_dict,
                "load_state_dict": lambda: opt.load_state_dict(opt.state_dict())}[name]
        call()
        results[name] = hasattr(inner, "__dynamo_disable")
    print(json.dumps(results))
"""


@pytest.fixture(scope="module")
def decorated_calls():
    return json.loads(_run(f"NAMES = {list(WRAPPED)!r}\n" + textwrap.dedent(DECORATED_CALLS)))


@pytest.mark.parametrize("name", WRAPPED)
def test_decorated_method_is_used_once_dynamo_is_loaded(decorated_calls, name):
    if decorated_calls[name] is None:
        pytest.skip(f"this torch does not decorate Optimizer.{name}")
    assert decorated_calls[name] is True
