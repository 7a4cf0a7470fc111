"""``fp16.fp16_master_weights_and_grads``: ZeRO-Offload keeps the masters and the gradient
partitions in fp16 on the host (half their bytes; DeepSpeedCPUAdam's moments stay fp32) and
trains like the fp32-master run; every other combination is refused by name."""
import pytest
import torch

from zero_models import ds_config, make_model, param_groups, train

STEPS, GAS = 3, 2


def _offload_run(fp16_masters):
    import deepspeed

    model = make_model()
    config = ds_config(2, GAS, offload_optimizer={"device": "cpu"})
    config["fp16"] = {"enabled": True, "initial_scale_power": 8,
                      "fp16_master_weights_and_grads": fp16_masters}
    engine, optimizer, _, _ = deepspeed.initialize(
        model=model, model_parameters=param_groups(model), config=config)
    params = train(engine, STEPS, GAS)
    masters = optimizer.master_params()
    moments = [optimizer.optimizer.state[m][key] for m in masters if m.numel()
               for key in ("exp_avg", "exp_avg_sq")]
    stored = masters + optimizer.grad_partitions
    return {"params": params, "skipped": engine.skipped_steps,
            "optimizer": type(optimizer.optimizer).__name__,
            "dtypes": {t.dtype for t in stored}, "devices": {t.device.type for t in stored},
            "bytes": sum(t.numel() * t.element_size() for t in stored),
            "moments": {m.dtype for m in moments}}


def test_fp16_masters_halve_the_offloaded_bytes_and_train_alike(dist_pool):
    fp32 = dist_pool.run(_offload_run, args=(False,))
    fp16 = dist_pool.run(_offload_run, args=(True,))
    for wide, narrow in zip(fp32, fp16):
        assert narrow["optimizer"] == "DeepSpeedCPUAdam" and narrow["skipped"] == 0
        assert wide["dtypes"] == {torch.float32} and narrow["dtypes"] == {torch.float16}
        assert narrow["devices"] == {"cpu"} and narrow["moments"] == {torch.float32}
        assert narrow["bytes"] * 2 == wide["bytes"]
        for name, value in wide["params"].items():
            torch.testing.assert_close(narrow["params"][name], value, rtol=0, atol=2e-3,
                                       msg=name)


def _config(zero, fp16=True):
    from deepspeed.config import DeepSpeedConfig

    return DeepSpeedConfig({"train_batch_size": 2, "zero_optimization": zero,
                            "zero_force_ds_cpu_optimizer": False,  # torch's Adam offloaded
                            "fp16": {"enabled": fp16, "fp16_master_weights_and_grads": True}},
                           world_size=1)


@pytest.mark.parametrize("zero, fp16, named", [
    ({"stage": 1, "offload_optimizer": {"device": "cpu"}}, True, "stage is 1"),
    ({"stage": 2}, True, "offload_optimizer.device is 'none'"),
    ({"stage": 2, "offload_optimizer": {"device": "cpu"}}, False, "fp16.enabled is false"),
], ids=["stage-1", "no-offload", "no-fp16"])
def test_fp16_masters_outside_zero_offload_are_refused(zero, fp16, named):
    from deepspeed.ops.adam import DeepSpeedCPUAdam
    from deepspeed.zero.plugin import check_optimizer

    config = _config(zero, fp16)
    optimizer = DeepSpeedCPUAdam([torch.nn.Parameter(torch.zeros(2))], use_native=False)
    with pytest.raises(ValueError, match=f"fp16_master_weights_and_grads.*{named}"):
        check_optimizer(config, config.section("zero_optimization"), optimizer)


def test_fp16_masters_need_a_cpu_adam_and_zero():
    from deepspeed.precision import precision_for
    from deepspeed.zero.plugin import check_optimizer

    config = _config({"stage": 2, "offload_optimizer": {"device": "cpu"}})
    torch_adam = torch.optim.Adam([torch.nn.Parameter(torch.zeros(2))])
    with pytest.raises(ValueError, match="fp16_master_weights_and_grads.*Adam does not keep"):
        check_optimizer(config, config.section("zero_optimization"), torch_adam)
    without_zero = _config({"stage": 0})
    with pytest.raises(ValueError, match="fp16_master_weights_and_grads.*ZeRO-Offload"):
        precision_for(without_zero, torch.nn.Linear(2, 2), torch_adam)
