"""The core engine on 2 gloo ranks against a single-process plain-PyTorch reference."""
import base64
import json
import sys

import pytest
import torch

from tiny_models import mlp, regression_data

STEPS, MICRO, WORLD = 3, 2, 2
GAS = 2
GLOBAL = MICRO * GAS * WORLD


def make_model():
    return mlp(8, 16, 4)


def make_data(gas=GAS):
    return regression_data(STEPS * MICRO * gas * WORLD, 8, 4)


def reference_params(gas):
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = make_data(gas)
    size = MICRO * gas * WORLD
    for s in range(STEPS):
        batch = slice(s * size, (s + 1) * size)
        torch.nn.functional.mse_loss(model(x[batch]), y[batch]).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
        opt.step()
        opt.zero_grad()
    return [p.detach() for p in model.parameters()]


def _train_data_parallel(gas):
    import deepspeed
    from deepspeed import comm as dist

    engine, opt, loader, sched = deepspeed.initialize(model=make_model(), config={
        "train_micro_batch_size_per_gpu": MICRO, "gradient_accumulation_steps": gas,
        "gradient_clipping": 0.5, "optimizer": {"type": "SGD", "params": {"lr": 0.1}}})
    assert loader is None and sched is None and opt is engine.optimizer
    size = MICRO * gas * WORLD
    assert engine.train_batch_size() == size
    x, y = make_data(gas)
    rank = dist.get_rank()
    boundaries, losses = [], []
    for s in range(STEPS):
        for m in range(gas):
            start = s * size + rank * MICRO * gas + m * MICRO
            boundaries.append(engine.is_gradient_accumulation_boundary())
            out = engine(x[start:start + MICRO])
            loss = torch.nn.functional.mse_loss(out, y[start:start + MICRO])
            losses.append((loss.item(), engine.backward(loss).item()))
            engine.step()
    assert engine.global_steps == STEPS and engine.micro_steps == STEPS * gas
    assert engine.global_samples == STEPS * size
    return [p.detach() for p in engine.module.parameters()], boundaries, losses


@pytest.mark.parametrize("gas", [1, 4])
def test_data_parallel_matches_single_process_reference(dist_pool, gas):
    results = dist_pool.run(_train_data_parallel, args=(gas,))
    expected = reference_params(gas)
    for params, boundaries, losses in results:
        for got, want in zip(params, expected):
            torch.testing.assert_close(got, want, rtol=0, atol=1e-6)
        assert boundaries == ([False] * (gas - 1) + [True]) * STEPS
        for raw, scaled in losses:
            assert scaled == pytest.approx(raw / gas)


def _initialize_from(source_kind, tmp_dir):
    import argparse

    import deepspeed

    config = {"train_batch_size": 8, "gradient_accumulation_steps": 2,
              "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}}
    if source_kind == "file":
        path = f"{tmp_dir}/ds_config.json"
        with open(path, "w") as f:
            f.write(json.dumps(config)[:-1] + ",}")  # a trailing comma, as in the docs
        kwargs = {"config": path}
    elif source_kind == "base64":
        kwargs = {"config": base64.urlsafe_b64encode(json.dumps(config).encode()).decode()}
    elif source_kind == "args":
        path = f"{tmp_dir}/args_config.json"
        with open(path, "w") as f:
            json.dump(config, f)
        kwargs = {"args": argparse.Namespace(local_rank=0, deepspeed_config=path)}
    elif source_kind == "config_params":
        kwargs = {"config_params": config}
    else:
        kwargs = {"config": config}
    engine, *_ = deepspeed.initialize(model=make_model(), **kwargs)
    return engine.config.to_dict(), engine.train_micro_batch_size_per_gpu()


def test_every_config_source_gives_the_same_engine(dist_pool, tmp_path):
    kinds = ["dict", "file", "base64", "args", "config_params"]
    seen = {kind: dist_pool.run(_initialize_from, args=(kind, str(tmp_path)))[0] for kind in kinds}
    for kind in kinds:
        assert seen[kind] == seen["dict"], kind
    assert seen["dict"][1] == 2  # 8 = micro * gas(2) * world(2)


def _data_and_scheduler():
    import deepspeed

    dataset = torch.utils.data.TensorDataset(torch.arange(16.0).unsqueeze(1))
    model = torch.nn.Linear(1, 1)
    engine, _, loader, sched = deepspeed.initialize(
        model=model, training_data=dataset, config={"train_micro_batch_size_per_gpu": 2},
        optimizer=lambda params: torch.optim.SGD(params, lr=1.0),
        lr_scheduler=lambda opt: torch.optim.lr_scheduler.StepLR(opt, 1, gamma=0.5))
    seen = [int(v) for (batch,) in loader for v in batch.flatten()]
    for _ in range(3):
        engine.backward(engine(torch.ones(2, 1)).sum())
        engine.step()
    return seen, engine.get_lr(), len(loader)


def test_training_data_is_sharded_and_scheduler_callable_is_built(dist_pool):
    (seen0, lr0, n0), (seen1, lr1, n1) = dist_pool.run(_data_and_scheduler)
    assert n0 == n1 == 4
    assert not set(seen0) & set(seen1) and sorted(seen0 + seen1) == list(range(16))
    assert lr0 == lr1 == [0.125]


def _plugins_follow_config(site_dir, enabled):
    sys.path.insert(0, site_dir)
    import importlib

    importlib.invalidate_caches()
    import deepspeed

    engine, *_ = deepspeed.initialize(model=torch.nn.Linear(2, 1), config={
        "train_micro_batch_size_per_gpu": 1, "optimizer": {"type": "SGD", "params": {"lr": 0.1}},
        "call_recorder": {"enabled": enabled}})
    recorder = engine.plugins.get_plugin("call_recorder")
    engine.backward(engine(torch.ones(1, 2)).sum())
    engine.step()
    engine.destroy()
    sys.path.remove(site_dir)
    if recorder is None:
        return None
    return recorder.calls, [r.op for r in recorder.comm_ops]


def test_disabled_plugin_hooks_never_run(dist_pool, install_fixture_package):
    site = str(install_fixture_package("ds_example_plugin"))
    assert dist_pool.run(_plugins_follow_config, args=(site, False)) == [None, None]
    calls, ops = dist_pool.run(_plugins_follow_config, args=(site, True))[0]
    assert calls[:2] == ["engine_init", "wrap_optimizer"] and calls[-1] == "after_step"
    assert "all_reduce" in ops  # the engine subscribed the plugin to deepspeed.comm events


def _custom_accelerator_used():
    import deepspeed
    from deepspeed.accelerator import reset_accelerator, set_accelerator
    from deepspeed.accelerator.cpu_accelerator import CPU_Accelerator

    class Counting(CPU_Accelerator):
        asked = 0

        def current_device_name(self):
            Counting.asked += 1
            return super().current_device_name()

    set_accelerator(Counting())
    try:
        engine, *_ = deepspeed.initialize(model=torch.nn.Linear(2, 1),
                                          config={"train_batch_size": 2})
        return Counting.asked, str(engine.device)
    finally:
        reset_accelerator()


def test_set_accelerator_takes_effect_in_initialize(dist_pool):
    for asked, device in dist_pool.run(_custom_accelerator_used):
        assert asked >= 1 and device == "cpu"


def _grad_norm(clip):
    import deepspeed

    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    engine, *_ = deepspeed.initialize(model=model, config={
        "train_micro_batch_size_per_gpu": 1, "gradient_clipping": clip,
        "optimizer": {"type": "SGD", "params": {"lr": 0.0}}})
    engine.backward(engine(torch.full((1, 4), 100.0)).sum())
    grads = [p.grad.clone() for p in engine.module.parameters()]
    engine.step()
    return engine.get_global_grad_norm(), float(torch.nn.utils.get_total_norm(grads))


def test_global_grad_norm_is_measured_when_clipping(dist_pool):
    norm, expected = dist_pool.run(_grad_norm, args=(1.0,))[0]
    assert norm == pytest.approx(expected) and expected > 1.0
    assert dist_pool.run(_grad_norm, args=(0.0,))[0][0] is None


def _activation_checkpointing_configured():
    import deepspeed
    from deepspeed import checkpointing

    checkpointing.reset()
    try:
        deepspeed.initialize(model=torch.nn.Linear(2, 1), config={
            "train_micro_batch_size_per_gpu": 1,
            "activation_checkpointing": {"partition_activations": False, "profile": True}})
        return checkpointing.is_configured()
    finally:
        checkpointing.reset()


def test_activation_checkpointing_section_configures_deepspeed_checkpointing(dist_pool):
    assert dist_pool.run(_activation_checkpointing_configured) == [True, True]
