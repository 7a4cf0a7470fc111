"""ZeRO stages 1 and 2 on 2 and 3 gloo ranks reproduce single-process AdamW (allclose 1e-6)."""
import pytest
import torch

from zero_models import (assert_offloaded, assert_on_engine_device, ds_config, make_model,
                         param_groups, placement, recording_pins, reference, train)

STEPS = 3


def _run(stage, gas, zero, steps=STEPS):
    """The trained parameters, and where the engine kept its masters (``placement``)."""
    import deepspeed

    model = make_model()
    with recording_pins() as pins:
        engine, optimizer, _, _ = deepspeed.initialize(
            model=model, model_parameters=param_groups(model),
            config=ds_config(stage, gas, **zero))
    assert type(optimizer).__name__ == "DeepSpeedZeroOptimizer"
    return train(engine, steps, gas), placement(engine, pins)


def _assert_matches(results, expected):
    for params in results:
        if isinstance(params, tuple):  # (parameters, placement) from _run
            params = params[0]
        assert params.keys() == expected.keys()
        for name, want in expected.items():
            torch.testing.assert_close(params[name], want, rtol=0, atol=1e-6, msg=name)


@pytest.mark.parametrize("world", [2, 3])
@pytest.mark.parametrize("stage", [1, 2, 3])
@pytest.mark.parametrize("overlap", [False, True])
def test_stage_matches_reference(dist_pool, world, stage, overlap):
    gas = 2
    zero = {"overlap_comm": overlap}
    if stage == 3:  # nothing is small enough to stay whole: every parameter is sharded
        zero["stage3_param_persistence_threshold"] = 0
    results = dist_pool.run(_run, world_size=world, args=(stage, gas, zero))
    _assert_matches(results, reference(STEPS, gas, world))
    for _, where in results:
        assert_on_engine_device(where)


@pytest.mark.parametrize("zero", [
    {"reduce_bucket_size": 7, "allgather_bucket_size": 10},
    {"reduce_scatter": False, "allgather_partitions": False},
    {"sub_group_size": 9, "contiguous_gradients": False, "round_robin_gradients": True},
], ids=["tiny-buckets", "allreduce-broadcast", "sub-groups"])
def test_layout_and_collective_choices_do_not_change_the_math(dist_pool, zero):
    results = dist_pool.run(_run, world_size=3, args=(2, 1, zero))
    _assert_matches(results, reference(STEPS, 1, 3))


@pytest.mark.parametrize("stage", [1, 2])
@pytest.mark.parametrize("pin", [True, False])
def test_cpu_offload_matches_reference(dist_pool, stage, pin):
    zero = {"offload_optimizer": {"device": "cpu", "pin_memory": pin}}
    results = dist_pool.run(_run, world_size=2, args=(stage, 2, zero))
    _assert_matches(results, reference(STEPS, 2, 2))
    for _, where in results:
        assert_offloaded(where, pinned=pin)


def _nvme_run(stage, path):
    import os

    import deepspeed
    from deepspeed import comm as dist

    model = make_model()
    zero = {"offload_optimizer": {"device": "nvme", "nvme_path": path}, "sub_group_size": 40}
    engine, optimizer, _, _ = deepspeed.initialize(
        model=model, model_parameters=param_groups(model), config=ds_config(stage, 2, **zero))
    params = train(engine, STEPS, 2)
    files = [f for _, _, names in os.walk(path) for f in names]
    swapped = optimizer.swapper.swapped_bytes()
    resident = [c.numel() for c in optimizer.master_params()]
    dist.barrier()
    return params, len(files), swapped, resident


@pytest.mark.parametrize("stage", [1, 2])
def test_nvme_offload_matches_reference(dist_pool, tmp_path, stage):
    results = dist_pool.run(_nvme_run, world_size=2, args=(stage, str(tmp_path)))
    _assert_matches([r[0] for r in results], reference(STEPS, 2, 2))
    for _, files, swapped, resident in results:
        assert files > 0 and swapped > 0  # masters and Adam moments live on disk between steps
        assert resident and all(n == 0 for n in resident)


def test_no_clipping_and_gas_1(dist_pool):
    results = dist_pool.run(_run_no_clip, world_size=2)
    _assert_matches(results, reference(STEPS, 1, 2, clip=0))


def _run_no_clip():
    import deepspeed

    model = make_model()
    config = ds_config(2, 1)
    config["gradient_clipping"] = 0.0
    engine, *_ = deepspeed.initialize(model=model, model_parameters=param_groups(model),
                                      config=config)
    params = train(engine, STEPS, 1)
    assert engine.get_global_grad_norm() is None
    return params
