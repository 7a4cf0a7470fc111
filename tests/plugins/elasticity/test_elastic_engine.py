"""An engine with an enabled ``elasticity`` section trains with the elastic plan: the same global
batch at every valid world size, the accumulation steps making up the difference; batch keys
next to it are an error unless ``ignore_non_elastic_batch_info`` says to drop them."""
import pytest
import torch

import deepspeed
from deepspeed.elasticity import compute_elastic_config
from deepspeed.testing.distributed import run_distributed

ELASTIC = {"enabled": True, "max_train_batch_size": 16, "micro_batch_sizes": [2, 4],
           "min_gpus": 1, "max_gpus": 4, "version": 0.1}


def _engine_batch(extra):
    import deepspeed as ds

    config = {"elasticity": dict(ELASTIC), "steps_per_print": 10 ** 6,
              "optimizer": {"type": "SGD", "params": {"lr": 0.1}}, **extra}
    engine, *_ = ds.initialize(model=torch.nn.Linear(3, 2), config=config)
    out = (engine.train_batch_size(), engine.train_micro_batch_size_per_gpu(),
           engine.gradient_accumulation_steps())
    engine.destroy()
    return out


@pytest.mark.parametrize("world", [1, 2])
def test_engine_uses_the_elastic_plan(world):
    batch, _valid, micro = compute_elastic_config({"elasticity": ELASTIC}, deepspeed.__version__,
                                                  world_size=world)
    got = run_distributed(_engine_batch, world_size=world, args=({},))
    assert got == [(batch, micro, batch // (micro * world))] * world
    assert batch == 16


def _initialize_error(extra):
    try:
        _engine_batch(extra)
    except Exception as exc:  # the error crosses the process boundary as text
        return f"{type(exc).__name__}: {exc}"
    return None


def test_batch_keys_next_to_elasticity():
    message = run_distributed(_initialize_error, world_size=1,
                              args=({"train_batch_size": 8},))[0]
    assert "ElasticityConfigError" in message and "train_batch_size" in message
    assert "ignore_non_elastic_batch_info" in message
    ignored = run_distributed(_engine_batch, world_size=1, args=(
        {"train_batch_size": 8, "elasticity": dict(ELASTIC, ignore_non_elastic_batch_info=True)},))
    assert ignored == [(16, 4, 4)]
