"""Bad input gets a clear error naming the key or value; world size 1 trains without compressing."""
import sys

import pytest
import torch

from deepspeed.testing.distributed import run_distributed

from onebit_training import config, data, engine, train


def _error_of(opt_type, params, hide_mpi4py=False):
    import deepspeed

    if hide_mpi4py:
        sys.modules["mpi4py"] = None  # as if not installed (import raises ImportError)
    try:
        engine(config(opt_type, **params))
    except (RuntimeError, ValueError, ImportError, deepspeed.config.DeepSpeedConfigError) as exc:
        return f"{type(exc).__name__}: {exc}"
    finally:
        if hide_mpi4py:
            del sys.modules["mpi4py"]
    return ""


@pytest.mark.parametrize("opt_type", ["OneBitAdam", "ZeroOneAdam", "OneBitLamb"])
@pytest.mark.parametrize("params, expected", [
    ({"amsgrad": True}, "does not support the AMSGrad variant"),
    ({"frezee_step": 3}, "optimizer.params.frezee_step"),
    ({"comm_backend_name": "carrier-pigeon"}, "'carrier-pigeon'"),
    ({"max_grad_norm": 1.0}, "gradient_clipping"),
])
def test_bad_params_are_named(opt_type, params, expected):
    for msg in run_distributed(_error_of, world_size=2, args=(opt_type, params)):
        assert expected in msg


def test_unknown_key_lists_the_allowed_ones():
    msg = run_distributed(_error_of, world_size=2, args=("OneBitLamb", {"factor_maxx": 2}))[0]
    assert "factor_maxx" in msg and "factor_max" in msg and "freeze_step" in msg


def test_mpi_backend_without_mpi4py_names_the_extra():
    for msg in run_distributed(_error_of, world_size=2,
                               args=("OneBitAdam", {"comm_backend_name": "mpi"}, True)):
        assert msg.startswith("ImportError") and "deepspeed[1bit]" in msg and "mpi4py" in msg


def _single_rank():
    from deepspeed import comm as dist

    x, y = data(6, 1)
    eng = engine(config("OneBitAdam", lr=1e-2, freeze_step=2))
    history = train(eng, 6, x, y)
    return dist.get_world_size(), [[op for op, _ in ops] for _, ops in history]


def test_world_size_one_trains_without_communication():
    world, ops = run_distributed(_single_rank, world_size=1)[0]
    assert world == 1 and ops == [[]] * 6


def test_optimizer_needs_initialised_comm():
    from deepspeed import comm as dist
    from deepspeed.onebit import OnebitAdam

    if dist.is_initialized():
        pytest.skip("this process already has a process group")
    with pytest.raises(RuntimeError, match="init_distributed"):
        OnebitAdam([torch.nn.Parameter(torch.zeros(2))])


def test_upstream_paths_and_names():
    from deepspeed.onebit import OneBitAdam, OnebitAdam, OneBitLamb, OnebitLamb, ZeroOneAdam
    from deepspeed.runtime.fp16.onebit.adam import OnebitAdam as UpAdam
    from deepspeed.runtime.fp16.onebit.lamb import OnebitLamb as UpLamb
    from deepspeed.runtime.fp16.onebit.zoadam import ZeroOneAdam as UpZo

    assert (UpAdam, UpLamb, UpZo) == (OnebitAdam, OnebitLamb, ZeroOneAdam)
    assert OneBitAdam is OnebitAdam and OneBitLamb is OnebitLamb


def test_upstream_name_constants_switch_the_plugin_on():
    """``deepspeed.runtime.config.ONEBIT_ADAM_OPTIMIZER`` ... are this plugin's exports, and
    written as ``optimizer.type`` they enable it."""
    from deepspeed.config import DeepSpeedConfig
    from deepspeed.onebit.plugin import OneBitPlugin
    from deepspeed.runtime import config as runtime_config

    for name in ("ONEBIT_ADAM_OPTIMIZER", "ZERO_ONE_ADAM_OPTIMIZER", "ONEBIT_LAMB_OPTIMIZER"):
        config = DeepSpeedConfig({"train_batch_size": 1, "optimizer": {
            "type": getattr(runtime_config, name)}}, world_size=1)
        assert OneBitPlugin().is_enabled(config, {}), name
    assert not OneBitPlugin().is_enabled(DeepSpeedConfig(
        {"train_batch_size": 1, "optimizer": {"type": runtime_config.ADAM_OPTIMIZER}},
        world_size=1), {})
