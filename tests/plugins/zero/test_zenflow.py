"""ZenFlow (`zero_optimization.zenflow`) over ZeRO-Offload on 2 gloo ranks, against plain
ZeRO-Offload and the single-process AdamW reference of ``zero_models``."""
import pytest
import torch

from zero_models import (ds_config, full_params, make_data, make_model, micro_batch,
                         param_groups, reference)

OFFLOAD = {"offload_optimizer": {"device": "cpu"}}


def _zenflow_config(stage, **zenflow):
    return ds_config(stage, 1, **OFFLOAD, zenflow=zenflow)


def _run(config, steps):
    """Parameters before the first and after each of ``steps`` steps, and once more after
    pending background work landed."""
    import deepspeed

    model = make_model()
    engine, optimizer, _, _ = deepspeed.initialize(model=model,
                                                   model_parameters=param_groups(model),
                                                   config=config)
    from deepspeed import comm as dist

    x, y = make_data(steps, 1, dist.get_world_size())  # drawn once: see zero_models.make_data
    history = [full_params(engine.module)]
    for step in range(steps):
        xb, yb = micro_batch(x, y, step, 0, dist.get_rank(), 1, dist.get_world_size())
        out = engine(xb.to(engine.module.a.weight.dtype)).float()  # bf16 runs: 16-bit inputs
        engine.backward(torch.nn.functional.mse_loss(out, yb))
        engine.step()
        history.append(full_params(engine.module))
    if hasattr(optimizer, "flush"):
        optimizer.flush()
    history.append(full_params(engine.module))
    kind = type(optimizer).__name__
    engine.destroy()
    return kind, history


def _plain_and_zenflow(steps, zenflow, extra=None):
    plain, zen = ds_config(2, 1, **OFFLOAD), _zenflow_config(2, **zenflow)
    return (_run(dict(plain, **(extra or {})), steps), _run(dict(zen, **(extra or {})), steps))


def test_bf16_full_ratio_equals_zero_offload(dist_pool):
    zenflow = {"topk_ratio": 1.0, "update_interval": 1, "select_interval": 1}
    results = dist_pool.run(_plain_and_zenflow, world_size=2,
                            args=(3, zenflow, {"bf16": {"enabled": True}}), timeout=600)
    for (_, plain), (_, zen) in results:
        for name, want in plain[-1].items():  # the bf16 weights both round the same masters
            torch.testing.assert_close(zen[-1][name], want, rtol=0, atol=1e-6, msg=name)


def test_full_ratio_every_step_equals_zero_offload(dist_pool):
    steps = 4
    zenflow = {"topk_ratio": 1.0, "update_interval": 1, "select_interval": 1}
    results = dist_pool.run(_plain_and_zenflow, world_size=2, args=(steps, zenflow),
                            timeout=600)
    expected = reference(steps, 1, 2)
    for (plain_kind, plain), (kind, zen) in results:
        assert (plain_kind, kind) == ("DeepSpeedZeroOptimizer", "ZenFlowZeroOptimizer")
        for name, want in plain[-1].items():
            torch.testing.assert_close(zen[-1][name], want, rtol=0, atol=1e-6, msg=name)
            torch.testing.assert_close(zen[-1][name], expected[name], rtol=0, atol=1e-5,
                                       msg=name)


def _changed_columns(history, name):
    """Per step, a bool per column of weight ``name``: did any element of it move?"""
    return [(after[name] != before[name]).any(dim=0).tolist()
            for before, after in zip(history, history[1:])]


def _zenflow_history(stage, steps, zenflow):
    return _run(_zenflow_config(stage, **zenflow), steps)[1]


def _assert_pattern(changed, selected, landing_steps, full_steps=()):
    """``selected`` columns move every step; the others only at ``landing_steps`` (and every
    column during warm-up ``full_steps``)."""
    for step, cols in enumerate(changed):
        moving = {c for c, moved in enumerate(cols) if moved}
        if step in full_steps or step in landing_steps:
            assert moving == set(range(len(cols))), (step, moving)
        else:
            assert moving == selected, (step, moving)


@pytest.mark.parametrize("stage", [2, 3])
def test_unimportant_columns_move_every_update_interval(dist_pool, stage):
    # a.weight is 13 x 7: ceil(0.3 * 7) = 3 columns selected once (select_interval 100)
    zenflow = {"topk_ratio": 0.3, "update_interval": 4, "select_interval": 100,
               "select_strategy": "step", "full_warm_up_rounds": 2}
    results = dist_pool.run(_zenflow_history, world_size=2, args=(stage, 2 + 8, zenflow),
                            timeout=600)
    first = _changed_columns(results[0][:-1], "a.weight")  # steps 0..9
    selected = {c for c, moved in enumerate(first[2]) if moved}
    assert len(selected) == 3
    _assert_pattern(first, selected, landing_steps={5, 9}, full_steps={0, 1})
    for history in results[1:]:  # every rank sees the same weights
        for name, value in history[-1].items():
            torch.testing.assert_close(value, results[0][-1][name], rtol=0, atol=0)
    biases = [(after["a.bias"] != before["a.bias"]).all() for before, after in
              zip(results[0][:-1], results[0][1:-1])]
    assert all(biases)  # 1-D tensors are always important


def test_overlap_step_lands_one_step_later_and_is_deterministic(dist_pool):
    zenflow = {"topk_ratio": 0.3, "update_interval": 4, "select_interval": 100,
               "overlap_step": True}
    runs = [dist_pool.run(_zenflow_history, world_size=2, args=(2, 9, zenflow), timeout=600)
            for _ in range(2)]
    history = runs[0][0]
    changed = _changed_columns(history[:-1], "a.weight")
    selected = {c for c, moved in enumerate(changed[0]) if moved}
    assert len(selected) == 3
    # boundaries after steps 3 and 7; their CPU results land in steps 4 and 8
    _assert_pattern(changed, selected, landing_steps={4, 8})
    for name, value in history[-1].items():
        torch.testing.assert_close(value, runs[1][0][-1][name], rtol=0, atol=0)


def _refused(zero, optimizer=None):
    import deepspeed

    model = make_model()
    config = ds_config(2, 1, **zero)
    if optimizer is not None:
        config["optimizer"] = {"type": optimizer, "params": {"lr": 0.01}}
    try:
        deepspeed.initialize(model=model, model_parameters=param_groups(model), config=config)
    except ValueError as exc:
        return str(exc)
    return None


def test_refuses_zenflow_without_cpu_offload(dist_pool):
    message = dist_pool.run(_refused, world_size=1, args=({"zenflow": {}},))[0]
    assert message is not None and "offload_optimizer" in message and "cpu" in message


def test_refuses_zenflow_with_a_non_adam_optimizer(dist_pool):
    zero = dict(OFFLOAD, zenflow={})
    message = dist_pool.run(_refused, world_size=1, args=(zero, "Adagrad"))[0]
    assert message is not None and "zenflow" in message and "Adam" in message, message
    assert "DeepSpeedCPUAdagrad" in message


@pytest.mark.parametrize("zenflow, key, allowed", [
    ({"select_strategy": "often"}, "select_strategy", "'auto', 'step', 'epoch'"),
    ({"select_interval": "sometimes"}, "select_interval", '"auto" or a positive integer'),
    ({"update_interval": 0}, "update_interval", '"auto" or a positive integer'),
    ({"update_interval": -2}, "update_interval", '"auto" or a positive integer'),
    ({"topk_ratio": 1.5}, "topk_ratio", "less than or equal to 1"),
    ({"topk_ratio": -0.1}, "topk_ratio", "greater than or equal to 0"),
    ({"select_strategy": "epoch"}, "steps_per_epoch", '"step" / "auto"'),
    ({"top_k_ratio": 0.1}, "top_k_ratio", "topk_ratio"),
])
def test_bad_zenflow_values_name_the_key_and_what_is_allowed(zenflow, key, allowed):
    from deepspeed.config import DeepSpeedConfig
    from deepspeed.zero.config import DeepSpeedZeroConfig

    with pytest.raises(Exception) as info:
        DeepSpeedConfig({"train_batch_size": 2, "zero_optimization": {"stage": 2,
                                                                      "zenflow": zenflow}},
                        sections={"zero_optimization": DeepSpeedZeroConfig}, world_size=1)
    assert key in str(info.value) and allowed in str(info.value), str(info.value)


def test_defaults_and_auto_values():
    from deepspeed.zero.zenflow import ZenFlowConfig

    config = ZenFlowConfig()
    assert (config.topk_ratio, config.select_strategy, config.select_interval,
            config.update_interval, config.full_warm_up_rounds, config.overlap_step,
            config.offload, config.auto_ratio, config.pt_reserved_cores_perc) == (
        0.1, "auto", "auto", "auto", 0, False, False, 0.99, 0.5)
    assert (config.resolved_update_interval, config.resolved_select_interval) == (4, 16)
    tutorial = ZenFlowConfig(topk_ratio=0.05, update_interval=4, select_interval=2,
                             select_strategy="epoch", steps_per_epoch=10)
    assert tutorial.resolved_select_interval == 20
    assert ZenFlowConfig(update_interval=4, select_interval=1).resolved_select_interval == 4


def test_tutorial_section_with_auto_values_validates():
    from deepspeed.config import DeepSpeedConfig
    from deepspeed.zero.config import DeepSpeedZeroConfig

    tutorial = {"topk_ratio": 0.05, "select_strategy": "auto", "select_interval": "auto",
                "update_interval": 4, "full_warm_up_rounds": 0, "overlap_step": True}
    config = DeepSpeedConfig({"train_batch_size": 2, "zero_optimization": {
        "stage": 2, "offload_optimizer": {"device": "cpu", "pin_memory": True},
        "zenflow": tutorial}}, sections={"zero_optimization": DeepSpeedZeroConfig},
        world_size=1)
    zenflow = config.section("zero_optimization").zenflow
    assert (zenflow.resolved_update_interval, zenflow.resolved_select_interval) == (4, 16)


def _save_and_resume(path):
    import deepspeed
    from deepspeed import comm as dist
    from deepspeed.utils import safe_get_full_fp32_param, safe_get_full_optimizer_state

    def build():
        model = make_model()
        config = _zenflow_config(2, topk_ratio=0.3, update_interval=2, select_interval=2,
                                 overlap_step=True)
        return deepspeed.initialize(model=model, model_parameters=param_groups(model),
                                    config=config)[:2]

    x, y = make_data(6, 1, dist.get_world_size())

    def steps(engine, first, count):
        for step in range(first, first + count):
            xb, yb = micro_batch(x, y, step, 0, dist.get_rank(), 1, dist.get_world_size())
            engine.backward(torch.nn.functional.mse_loss(engine(xb), yb))
            engine.step()

    engine, optimizer = build()
    steps(engine, 0, 3)  # a background CPU step is in flight after step 3 (index 2)
    engine.save_checkpoint(path, tag="t")
    saved = {n: (safe_get_full_fp32_param(p), safe_get_full_optimizer_state(p, "exp_avg"))
             for n, p in engine.module.named_parameters() if p.requires_grad}
    model_after_save = full_params(engine.module)
    engine.destroy()
    engine, optimizer = build()
    engine.load_checkpoint(path, tag="t")
    loaded = {n: (safe_get_full_fp32_param(p), safe_get_full_optimizer_state(p, "exp_avg"))
              for n, p in engine.module.named_parameters() if p.requires_grad}
    model_after_load = full_params(engine.module)
    assert optimizer.steps == 3  # the device Adam's step count resumes
    steps(engine, 3, 3)
    optimizer.flush()
    finite = all(torch.isfinite(v).all() for v in full_params(engine.module).values())
    engine.destroy()
    return saved, loaded, model_after_save, model_after_load, finite


def test_checkpoint_holds_the_flushed_state(dist_pool, tmp_path):
    results = dist_pool.run(_save_and_resume, world_size=2, args=(str(tmp_path),), timeout=600)
    for saved, loaded, model_saved, model_loaded, finite in results:
        assert finite
        for name, (master, moment) in saved.items():
            torch.testing.assert_close(loaded[name][0], master, rtol=0, atol=0, msg=name)
            torch.testing.assert_close(loaded[name][1], moment, rtol=0, atol=0, msg=name)
            # the model's weights are the masters: the landed background step was published
            torch.testing.assert_close(model_saved[name], master, rtol=0, atol=0, msg=name)
            torch.testing.assert_close(model_loaded[name], master, rtol=0, atol=0, msg=name)


def _selections(zenflow, steps):
    """After each step: the step (counted from warm-up's end) of the latest column selection,
    and the parameters."""
    import deepspeed
    from deepspeed import comm as dist

    model = make_model()
    engine, optimizer, _, _ = deepspeed.initialize(model=model,
                                                   model_parameters=param_groups(model),
                                                   config=_zenflow_config(2, **zenflow))
    x, y = make_data(steps, 1, dist.get_world_size())
    selected_at, history = [], [full_params(engine.module)]
    for step in range(steps):
        xb, yb = micro_batch(x, y, step, 0, dist.get_rank(), 1, dist.get_world_size())
        engine.backward(torch.nn.functional.mse_loss(engine(xb), yb))
        engine.step()
        selected_at.append(optimizer.selected_at)
        history.append(full_params(engine.module))
    engine.destroy()
    return selected_at, history


def test_select_interval_counts_epochs_and_update_interval_sets_the_cpu_cadence(dist_pool):
    # select_strategy "epoch": select_interval 1 is one epoch of 2 steps, so columns are
    # re-selected every 2 steps ("step" would re-select every step, "auto" every 4 updates);
    # update_interval 1: the CPU step lands every step, so every column moves every step
    zenflow = {"topk_ratio": 0.3, "select_strategy": "epoch", "steps_per_epoch": 2,
               "select_interval": 1, "update_interval": 1}
    selected_at, history = dist_pool.run(_selections, world_size=2, args=(zenflow, 6),
                                         timeout=600)[0]
    assert selected_at == [0, 0, 2, 2, 4, 4]
    for cols in _changed_columns(history, "a.weight"):
        assert all(cols)
