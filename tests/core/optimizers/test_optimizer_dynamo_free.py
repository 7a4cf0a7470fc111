"""DeepSpeed's optimizers do not import ``torch._dynamo`` (+72 MiB per rank) when nothing is
compiled, and use torch's dynamo-disabled methods once dynamo is loaded.

Each case runs in a fresh interpreter: pytest's own process may already have imported dynamo.
"""
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


def test_optimizer_lifecycle_does_not_import_dynamo():
    out = _run("""
        import sys, torch
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
        print("torch._dynamo" in sys.modules)
    """)
    assert out == "False"


def test_engine_step_with_the_default_cpu_optimizer_does_not_import_dynamo():
    out = _run("""
        import sys, torch, deepspeed
        model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
        config = {"train_batch_size": 2, "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
                  "zero_optimization": {"stage": 3}}
        engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                          config=config)
        assert type(engine.basic_optimizer).__name__ == "DeepSpeedCPUAdam"
        for _ in range(2):
            engine.backward(engine(torch.randn(2, 8)).sum())
            engine.step()
        print("torch._dynamo" in sys.modules)
    """)
    assert out == "False"


@pytest.mark.parametrize("name", WRAPPED)
def test_decorated_method_is_used_once_dynamo_is_loaded(name):
    decorated = getattr(torch.optim.Optimizer, name)
    if not hasattr(decorated, "__wrapped__"):
        pytest.skip(f"this torch does not decorate Optimizer.{name}")
    out = _run(f"""
        import torch, torch._dynamo
        from deepspeed.ops.adam import DeepSpeedCPUAdam
        param = torch.nn.Parameter(torch.randn(3))
        opt = DeepSpeedCPUAdam([param])
        inner = torch.optim.Optimizer.{name}.__wrapped__
        # torch's decorator caches its dynamo-disabled function on the inner one when it runs
        if hasattr(inner, "__dynamo_disable"):
            del inner.__dynamo_disable
        call = {{"add_param_group": lambda: opt.add_param_group({{"params": [torch.nn.Parameter(torch.randn(2))]}}),
                 "zero_grad": opt.zero_grad, "state_dict": opt.state_dict,
                 "load_state_dict": lambda: opt.load_state_dict(opt.state_dict())}}["{name}"]
        call()
        print(hasattr(inner, "__dynamo_disable"))
    """)
    assert out == "True"
