"""Core keys checked where their effect shows directly, on one gloo rank: ``fp16.auto_cast``
casts the inputs, ``dataloader_drop_last`` drops the partial batch, and every key of the ``amp``
section reaches ``apex.amp.initialize`` (a stand-in apex records the call: apex itself needs
CUDA)."""
import sys
import types

import torch

APEX_KEYS = {"opt_level": "O2", "cast_model_type": "torch.float16",
             "patch_torch_functions": False, "keep_batchnorm_fp32": True, "master_weights": True,
             "loss_scale": "dynamic", "cast_model_outputs": "torch.float32", "num_losses": 2,
             "verbosity": 0, "min_loss_scale": 1.0, "max_loss_scale": 65536.0}


class Recorder(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(4, 2)
        self.seen = []

    def forward(self, x):
        self.seen.append(x.dtype)
        return self.linear(x.to(self.linear.weight.dtype))


def _auto_cast(on):
    import deepspeed

    model = Recorder()
    engine, *_ = deepspeed.initialize(
        model=model, model_parameters=model.parameters(),
        config={"train_micro_batch_size_per_gpu": 2, "fp16": {"enabled": True, "auto_cast": on},
                "optimizer": {"type": "SGD", "params": {"lr": 0.1}}})
    engine(torch.randn(2, 4))
    engine.destroy()
    return model.seen


def test_fp16_auto_cast_casts_float_inputs(dist_pool):
    assert dist_pool.run(_auto_cast, world_size=1, args=(True,)) == [[torch.float16]]
    assert dist_pool.run(_auto_cast, world_size=1, args=(False,)) == [[torch.float32]]


def _batches(drop_last):
    import deepspeed

    model = torch.nn.Linear(4, 2)
    engine, *_ = deepspeed.initialize(
        model=model, model_parameters=model.parameters(),
        config={"train_micro_batch_size_per_gpu": 2, "dataloader_drop_last": drop_last,
                "optimizer": {"type": "SGD", "params": {"lr": 0.1}}})
    dataset = torch.utils.data.TensorDataset(torch.randn(5, 4))
    count = len(engine.deepspeed_io(dataset))
    engine.destroy()
    return count


def test_dataloader_drop_last_drops_the_partial_batch(dist_pool):
    assert dist_pool.run(_batches, world_size=1, args=(True,)) == [2]
    assert dist_pool.run(_batches, world_size=1, args=(False,)) == [3]


def _amp_call():
    import deepspeed

    calls = []
    apex, amp = types.ModuleType("apex"), types.ModuleType("apex.amp")

    def initialize(model, optimizer, **kwargs):
        calls.append(kwargs)
        return model, optimizer

    amp.initialize, apex.amp = initialize, amp
    sys.modules["apex"], sys.modules["apex.amp"] = apex, amp
    try:
        model = torch.nn.Linear(4, 2)
        engine, *_ = deepspeed.initialize(
            model=model, model_parameters=model.parameters(),
            config={"train_micro_batch_size_per_gpu": 2, "amp": dict(APEX_KEYS, enabled=True),
                    "optimizer": {"type": "SGD", "params": {"lr": 0.1}}})
        engine.destroy()
    finally:
        del sys.modules["apex"], sys.modules["apex.amp"]
    return calls


def test_every_amp_key_reaches_apex_amp_initialize(dist_pool):
    [calls] = dist_pool.run(_amp_call, world_size=1)
    assert calls == [APEX_KEYS]


FP16 = {"enabled": True, "initial_scale_power": 5, "loss_scale_window": 7, "hysteresis": 3,
        "consecutive_hysteresis": True, "min_loss_scale": 0.5}


def _loss_scaler():
    import deepspeed

    model = torch.nn.Linear(4, 2)
    engine, optimizer, *_ = deepspeed.initialize(
        model=model, model_parameters=model.parameters(),
        config={"train_micro_batch_size_per_gpu": 2, "fp16": FP16,
                "optimizer": {"type": "SGD", "params": {"lr": 0.1}}})
    scaler = optimizer.loss_scaler
    settings = (scaler.cur_scale, scaler.scale_window, scaler.delayed_shift,
                scaler.consecutive_hysteresis, scaler.min_scale)
    engine.destroy()
    return settings


def test_the_fp16_loss_scaler_is_built_from_its_keys(dist_pool):
    assert dist_pool.run(_loss_scaler, world_size=1) == [(32.0, 7, 3, True, 0.5)]


def _reduced_gradient(prescale, predivide):
    """The averaged gradient of one weight whose per-rank gradient (40000) is representable in
    fp16 but whose two-rank sum (80000) is not, reduced in fp16."""
    import deepspeed

    model = torch.nn.Linear(1, 1, bias=False)
    engine, *_ = deepspeed.initialize(
        model=model, model_parameters=model.parameters(),
        config={"train_micro_batch_size_per_gpu": 1, "communication_data_type": "fp16",
                "prescale_gradients": prescale, "gradient_predivide_factor": predivide,
                "optimizer": {"type": "SGD", "params": {"lr": 0.0}}})
    engine.backward(engine(torch.full((1, 1), 40000.0)).sum())
    grad = model.weight.grad.item()
    engine.destroy()
    return grad


def test_prescale_gradients_divides_before_the_reduction_so_fp16_sums_stay_in_range(dist_pool):
    # prescale_gradients with gradient_predivide_factor 2: each rank sends 20000, the sum 40000
    # fits fp16, and the factor is given back after the reduction: the average is exact
    assert dist_pool.run(_reduced_gradient, args=(True, 2.0)) == [40000.0, 40000.0]
    # without the pre-division (or with a factor of 1) the fp16 sum overflows
    for grad in dist_pool.run(_reduced_gradient, args=(False, 2.0)):
        assert grad == float("inf")
