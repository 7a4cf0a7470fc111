"""What the ZeRO plugin answers the core through ``deepspeed.hooks``: where the optimizer
steps (ZeRO-Offload picks DeepSpeed's CPU optimizer) and how the state is sharded (the
engine's ``zero_optimization_stage()``, ``no_sync`` refusal and 16-bit save switch)."""
import pytest
import torch

from deepspeed.ops.adam import DeepSpeedCPUAdam

from zero_models import LR, MICRO


def _answers(zero):
    import deepspeed

    model = torch.nn.Linear(4, 2)
    config = {"train_micro_batch_size_per_gpu": MICRO,
              "optimizer": {"type": "Adam", "params": {"lr": LR}}, "zero_optimization": zero}
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                      config=config)
    answer = (engine.hook.deepspeed_optimizer_device(engine=engine),
              type(engine.basic_optimizer).__name__, engine.zero_optimization_stage(),
              engine.sharding.partitions_gradients,
              engine.zero_gather_16bit_weights_on_model_save())
    engine.destroy()
    return answer


@pytest.mark.parametrize("zero,expected", [
    ({"stage": 2, "offload_optimizer": {"device": "cpu"}}, ("cpu", 2, True, False)),
    ({"stage": 2, "cpu_offload": True}, ("cpu", 2, True, False)),  # the pre-0.5 spelling
    ({"stage": 1}, (None, 1, False, False)),
    ({"stage": 3, "stage3_gather_16bit_weights_on_model_save": True}, (None, 3, True, True)),
])
def test_zero_answers_optimizer_device_and_sharding(dist_pool, zero, expected):
    device, optimizer, stage, partitioned, gathers = dist_pool.run(_answers, args=(zero,))[0]
    assert (device, stage, partitioned, gathers) == expected
    if device == "cpu":
        assert optimizer == DeepSpeedCPUAdam.__name__


def _no_sync_refused():
    import deepspeed

    model = torch.nn.Linear(4, 2)
    config = {"train_micro_batch_size_per_gpu": MICRO,
              "optimizer": {"type": "Adam", "params": {"lr": LR}},
              "zero_optimization": {"stage": 2}}
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                      config=config)
    try:
        with engine.no_sync():
            return "entered"
    except AssertionError as err:
        return str(err)
    finally:
        engine.destroy()


def test_no_sync_is_refused_when_gradients_are_partitioned(dist_pool):
    assert all("no_sync is not compatible with ZeRO stage 2" in m
               for m in dist_pool.run(_no_sync_refused))
