"""Every config optimizer through ``deepspeed.initialize`` on 2 gloo ranks (gas 2) equals one
process stepping the same optimizer class with plain PyTorch on the global batch."""
import pytest
import torch

from deepspeed.ops.adagrad import DeepSpeedCPUAdagrad
from deepspeed.ops.adam import DeepSpeedCPUAdam
from deepspeed.ops.lamb import FusedLamb
from deepspeed.ops.lion import DeepSpeedCPULion
from tiny_models import mlp, regression_data

STEPS, GAS, MICRO, WORLD = 3, 2, 2, 2
GLOBAL = MICRO * GAS * WORLD

# (config type, config params, the class a CPU run must build, its constructor kwargs)
CASES = [
    ("Adam", {"lr": 0.01, "weight_decay": 0.1}, DeepSpeedCPUAdam,
     {"lr": 0.01, "weight_decay": 0.1, "adamw_mode": True}),
    ("Adam", {"lr": 0.01, "weight_decay": 0.1, "adam_w_mode": False}, DeepSpeedCPUAdam,
     {"lr": 0.01, "weight_decay": 0.1, "adamw_mode": False}),
    ("AdamW", {"lr": 0.01, "betas": [0.8, 0.9], "bias_correction": False}, DeepSpeedCPUAdam,
     {"lr": 0.01, "betas": (0.8, 0.9), "bias_correction": False}),
    ("Adam", {"lr": 0.01, "weight_decay": 0.1, "torch_adam": True, "adam_w_mode": False},
     torch.optim.Adam, {"lr": 0.01, "weight_decay": 0.1}),
    ("Lamb", {"lr": 0.01, "weight_decay": 0.01}, FusedLamb, {"lr": 0.01, "weight_decay": 0.01}),
    ("Lion", {"lr": 0.001, "weight_decay": 0.1}, DeepSpeedCPULion,
     {"lr": 0.001, "weight_decay": 0.1}),
    ("Adagrad", {"lr": 0.1}, DeepSpeedCPUAdagrad, {"lr": 0.1}),
    ("SGD", {"lr": 0.1, "momentum": 0.9}, torch.optim.SGD, {"lr": 0.1, "momentum": 0.9}),
]


def make_model():
    return mlp(8, 16, 4, activation=torch.nn.Tanh)


def make_data():
    return regression_data(STEPS * GLOBAL, 8, 4)


def param_groups(model, grouped):
    if not grouped:
        return list(model.parameters())
    return [{"params": list(model[0].parameters()), "lr": 0.05, "weight_decay": 0.0},
            {"params": list(model[2].parameters())}]


def reference(cls, kwargs, grouped):
    model = make_model()
    opt = cls(param_groups(model, grouped), **kwargs)
    x, y = make_data()
    for s in range(STEPS):
        batch = slice(s * GLOBAL, (s + 1) * GLOBAL)
        torch.nn.functional.mse_loss(model(x[batch]), y[batch]).backward()
        opt.step()
        opt.zero_grad()
    return [p.detach() for p in model.parameters()]


def _train(cases, grouped):
    import deepspeed
    from deepspeed import comm as dist

    rank = dist.get_rank()
    x, y = make_data()
    results = []
    for type_, params, _, _ in cases:
        model = make_model()
        engine, opt, _, _ = deepspeed.initialize(
            model=model, model_parameters=param_groups(model, grouped), config={
                "train_micro_batch_size_per_gpu": MICRO, "gradient_accumulation_steps": GAS,
                "optimizer": {"type": type_, "params": params}})
        for s in range(STEPS):
            for m in range(GAS):
                start = s * GLOBAL + rank * MICRO * GAS + m * MICRO
                out = engine(x[start:start + MICRO])
                engine.backward(torch.nn.functional.mse_loss(out, y[start:start + MICRO]))
                engine.step()
        engine.destroy()
        results.append((type(opt).__name__,
                        [p.detach() for p in engine.module.parameters()]))
    return results


@pytest.mark.parametrize("grouped", [False, True], ids=["one-group", "param-groups"])
def test_config_optimizers_match_plain_pytorch_on_the_global_batch(dist_pool, grouped):
    cases = CASES if not grouped else [CASES[0], CASES[4], CASES[5]]
    ranks = dist_pool.run(_train, args=(cases, grouped))
    for index, (type_, params, cls, kwargs) in enumerate(cases):
        expected = reference(cls, kwargs, grouped)
        for results in ranks:
            name, got = results[index]
            assert name == cls.__name__, (type_, params)
            for g, e in zip(got, expected):
                torch.testing.assert_close(g, e, rtol=1e-5, atol=1e-5, msg=f"{type_} {params}")
