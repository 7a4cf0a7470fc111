"""Compression and MoQ keys checked where their effect shows: symmetric/asymmetric and
nearest/stochastic weight quantization, asymmetric activation quantization, MoQ's
quantization type (``quantize_type`` or ``quantize-algo.q_type``), rounding, groups, and its
per-step log line (``quantize_verbose``)."""
import logging

import torch
from cp_helpers import group, logged_lines, section

from deepspeed.compression.compress import init_compression
from deepspeed.compression.config import QuantizeTrainingConfig
from deepspeed.compression.moq import MoQQuantizer


def _quantized_weight(**shared):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 8))
    with torch.no_grad():
        model[0].weight.add_(1.0)  # all positive: the symmetric grid wastes its negative half
    init_compression(model, section(weight_quantization=(
        dict({"schedule_offset": 0, "quantize_weight_in_forward": True}, **shared),
        {"wq1": group(["0"], start_bits=3, target_bits=3, quantization_period=1)})))
    from deepspeed.compression.scheduler import compression_scheduler

    compression_scheduler(model).step(0)
    return model[0].effective_weight_and_bias()[0].detach(), model[0].weight.detach()


def test_weight_quantization_type_and_rounding_choose_the_grid():
    symmetric, original = _quantized_weight()
    asymmetric, _ = _quantized_weight(quantization_type="asymmetric")
    error = lambda q: (q - original).abs().max().item()  # noqa: E731
    assert error(asymmetric) < error(symmetric)  # 8 levels over [min, max], not [-max, max]
    torch.manual_seed(1)
    stochastic, _ = _quantized_weight(rounding="stochastic")
    assert not torch.equal(stochastic, symmetric)
    assert stochastic.unique().numel() <= 8


def test_activation_quantization_type_chooses_the_grid():
    outputs = {}
    for kind in ("symmetric", "asymmetric"):
        model = torch.nn.Sequential(torch.nn.Linear(16, 4))
        init_compression(model, section(activation_quantization=(
            {"range_calibration": "dynamic", "quantization_type": kind},
            {"aq1": group(["0"], bits=4)})))
        outputs[kind] = model[0].quantize_input(torch.linspace(0.0, 3.0, 16).reshape(1, 16))
    # 4 bits over [0, 3]: asymmetric spends all 16 levels there, symmetric half of them
    assert outputs["asymmetric"].unique().numel() > outputs["symmetric"].unique().numel()


def _moq(**overrides):
    body = {"enabled": True, "quantize_groups": 1,
            "quantize_bits": {"start_bits": 4, "target_bits": 4},
            "quantize_schedule": {"quantize_period": 100, "schedule_offset": 0}}
    body.update(overrides)
    return MoQQuantizer(QuantizeTrainingConfig.model_validate(body))


def _moq_weight(**overrides):
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 4, bias=False)
    with torch.no_grad():
        model.weight.abs_()
    _moq(**overrides).step(model, 1)
    return model.weight.detach()


def test_moq_type_rounding_and_groups():
    symmetric = _moq_weight()
    assert torch.equal(_moq_weight(quantize_type="asymmetric"),
                       _moq_weight(**{"quantize-algo": {"q_type": "asymmetric"}}))
    assert not torch.equal(_moq_weight(quantize_type="asymmetric"), symmetric)
    torch.manual_seed(3)
    assert not torch.equal(_moq_weight(**{"quantize-algo": {"rounding": "stochastic"}}),
                           symmetric)
    assert not torch.equal(_moq_weight(quantize_groups=4), symmetric)  # a scale per group


def _moq_engine(verbose):
    import deepspeed

    with logged_lines() as lines:
        model = torch.nn.Linear(8, 4)
        engine, *_ = deepspeed.initialize(
            model=model, model_parameters=model.parameters(),
            config={"train_micro_batch_size_per_gpu": 2,
                    "optimizer": {"type": "SGD", "params": {"lr": 0.1}},
                    "quantize_training": {"enabled": True, "quantize_verbose": verbose}})
        engine.backward(engine(torch.randn(2, 8)).sum())
        engine.step()
        engine.destroy()
    return [line for line in lines if "MoQ step" in line]


def test_quantize_verbose_logs_each_moq_step(dist_pool):
    assert len(dist_pool.run(_moq_engine, world_size=1, args=(True,))[0]) == 1
    assert dist_pool.run(_moq_engine, world_size=1, args=(False,))[0] == []


def test_related_modules_of_an_unstructured_technique_warn_once_naming_the_group(caplog):
    from deepspeed.config.without_effect import reset_without_effect_warnings
    from deepspeed.utils.logging import logger

    reset_without_effect_warnings()
    logger.addHandler(caplog.handler)
    try:
        with caplog.at_level(logging.WARNING):
            init_compression(torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)),
                             section(weight_quantization=({}, {"wq1": group(
                                 ["0"], [["1"]], start_bits=8, target_bits=8)})))
    finally:
        logger.removeHandler(caplog.handler)
        reset_without_effect_warnings()
    warned = [r.getMessage() for r in caplog.records if "has no effect here" in r.getMessage()]
    assert len(warned) == 1 and warned[0].startswith(
        "compression_training.weight_quantization.different_groups.wq1.related_modules ")


def _activation_layer(**shared):
    model = torch.nn.Sequential(torch.nn.Linear(4, 4))
    init_compression(model, section(activation_quantization=(
        shared, {"aq1": group(["0"], bits=8)})))
    from deepspeed.compression.scheduler import compression_scheduler

    return model, compression_scheduler(model)


def test_activation_range_calibration_and_schedule_offset():
    # static: training forwards calibrate one range; dynamic: each token has its own, none kept
    static, scheduler = _activation_layer(range_calibration="static")
    scheduler.step(0)
    static.train()(torch.full((2, 4), 3.0))
    dynamic, scheduler = _activation_layer(range_calibration="dynamic")
    scheduler.step(0)
    dynamic.train()(torch.full((2, 4), 3.0))
    assert static[0].activation_range_seen.item() == 1
    assert not hasattr(dynamic[0], "activation_range_seen")
    # schedule_offset: inputs pass unquantized before the offset step
    late, scheduler = _activation_layer(range_calibration="dynamic", schedule_offset=5)
    x = torch.linspace(-1.0, 1.0, 4).reshape(1, 4) / 3
    scheduler.step(4)
    assert torch.equal(late[0].quantize_input(x), x)
    scheduler.step(5)
    assert not torch.equal(late[0].quantize_input(x), x)


def test_pruning_groups_choose_method_ratio_modules_and_offset():
    # non-default values throughout: row pruning by l1 (a fixed mask, default topk), channel
    # pruning by topk (learnable scores, default l1), each group's dense_ratio 0.25 (default
    # 0.5), modules naming one layer (default every layer), offsets above 0
    from deepspeed.compression.scheduler import compression_scheduler

    from cp_helpers import TinyCNN

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 8),
                                torch.nn.ReLU(), torch.nn.Linear(8, 2))
    init_compression(model, section(
        row_pruning=({"method": "l1", "schedule_offset": 2},
                     {"rp1": group(["^0$"], dense_ratio=0.25)}),
        head_pruning=({"num_heads": 4, "schedule_offset": 2},
                      {"hp1": group(["^2$"], dense_ratio=0.25)}),
        sparse_pruning=({"method": "l1", "schedule_offset": 1},
                        {"sp1": group(["^2$"], dense_ratio=0.25)})))
    assert type(model[4]) is torch.nn.Linear  # no group names it
    assert set(model[0].plan) == {"row_pruning"}
    assert set(model[2].plan) == {"head_pruning", "sparse_pruning"}
    assert not [name for name, _ in model.named_parameters() if "mask_scores" in name
                and name.startswith("0.")]  # l1: nothing learnable added
    scheduler = compression_scheduler(model)
    assert model[0].row_mask() is None and model[2].sparse_mask() is None
    scheduler.step(1)
    assert model[2].sparse_mask().sum() == 0.25 * 16 * 8 and model[0].row_mask() is None
    assert model[2].column_mask() is None
    scheduler.step(2)
    assert model[0].row_mask().sum() == 4  # 16 rows x 0.25
    assert model[2].column_mask().sum() == 4  # 1 of 4 heads of 4 columns

    cnn = TinyCNN()
    init_compression(cnn, section(channel_pruning=(
        {"method": "topk", "schedule_offset": 1}, {"cp1": group(["conv1"], dense_ratio=0.25)})))
    assert type(cnn.conv2) is torch.nn.Conv2d
    assert "row_mask_scores" in dict(cnn.conv1.named_parameters())  # topk: learnable scores
    scheduler = compression_scheduler(cnn)
    assert cnn.conv1.row_mask() is None
    scheduler.step(1)
    assert cnn.conv1.row_mask().sum() == 2  # 8 channels x 0.25


def _two_bit_weight(in_forward, groups):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 8))
    stored = model[0].weight.detach().clone()
    init_compression(model, section(weight_quantization=(
        {"quantize_weight_in_forward": in_forward, "quantize_groups": groups},
        {"wq1": group(["0"], start_bits=2, target_bits=2)})))
    used, _ = model[0].effective_weight_and_bias()
    return used.unique().numel(), torch.equal(model[0].weight, stored)


def test_quantize_groups_and_quantize_weight_in_forward():
    # quantize_groups 2: two 2-bit grids (at most 4 values each), so more than 4 values in all;
    # quantize_weight_in_forward: the stored weight stays full precision, only the forward's
    # copy is quantized (default false: the stored weight itself is rewritten)
    values, stored_kept = _two_bit_weight(in_forward=True, groups=2)
    assert values > 4 and stored_kept
    assert _two_bit_weight(in_forward=False, groups=1) == (3, False)
