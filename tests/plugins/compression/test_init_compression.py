"""init_compression swaps exactly the layers the patterns name; the schedule switches
techniques on at their offset and steps the weight bits; masks have the documented density."""
import logging

import pytest
import torch
from cp_helpers import TinyCNN, group, section, tiny_bert

from deepspeed.compression.basic_layer import (Conv2dLayer_Compress, Embedding_Compress,
                                               LinearLayer_Compress)
from deepspeed.compression.compress import init_compression
from deepspeed.compression.scheduler import compression_scheduler


def wq(start=8, target=8, period=1, offset=0, modules=("*",), in_forward=True, groups=1, **shared):
    return section(weight_quantization=(
        {"schedule_offset": offset, "quantize_weight_in_forward": in_forward,
         "quantize_groups": groups, **shared},
        {"wq1": group(list(modules), start_bits=start, target_bits=target,
                      quantization_period=period)}))


def test_patterns_select_layers_and_leave_others_alone():
    model = tiny_bert()
    init_compression(model, wq(modules=["attention.self", "word_embeddings"]))
    kinds = {name: type(m) for name, m in model.named_modules()}
    for layer in range(2):
        for proj in ("query", "key", "value"):
            assert kinds[f"bert.encoder.layer.{layer}.attention.self.{proj}"] is LinearLayer_Compress
        assert kinds[f"bert.encoder.layer.{layer}.intermediate.dense"] is torch.nn.Linear
    assert kinds["bert.embeddings.word_embeddings"] is Embedding_Compress
    assert kinds["classifier"] is torch.nn.Linear


def test_unmatched_pattern_is_named_in_a_warning(caplog):
    model = tiny_bert()
    with caplog.at_level(logging.WARNING):
        init_compression(model, wq(modules=["attention.self", "no_such_layer"]))
    assert any("no_such_layer" in r.getMessage() and "wq1" in r.getMessage()
               for r in caplog.records)


def test_compressed_layer_computes_like_the_original_when_idle():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 5))
    x = torch.randn(3, 6)
    before = model(x)
    init_compression(model, wq(offset=10))
    assert isinstance(model[0], LinearLayer_Compress)
    torch.testing.assert_close(model(x), before)  # before schedule_offset nothing changes


def _distinct_per_group(weight, groups):
    return max(row.unique().numel() for row in weight.detach().reshape(groups, -1))


def test_weight_bits_follow_the_schedule():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 8))
    init_compression(model, wq(start=7, target=4, period=3, offset=2, groups=2))
    layer, scheduler = model[0], compression_scheduler(model)
    seen = {}
    for step in range(0, 20):
        scheduler.step(step)
        weight, _ = layer.effective_weight_and_bias()
        seen[step] = layer.weight_bits
        if layer.weight_bits is not None:
            assert _distinct_per_group(weight, 2) <= 2 ** layer.weight_bits
        else:
            assert torch.equal(weight, layer.weight)
    expected = {s: None if s < 2 else max(4, 7 - (s - 2) // 3) for s in range(20)}
    assert seen == expected


def test_quantization_outside_forward_rewrites_the_stored_weight():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 8))
    init_compression(model, wq(start=3, target=3, in_forward=False, groups=4))
    assert _distinct_per_group(model[0].weight, 4) <= 8


def test_conv_and_activation_quantization():
    model = TinyCNN()
    cfg = section(activation_quantization=({"range_calibration": "dynamic"},
                                           {"aq1": group(["conv"], bits=4)}))
    init_compression(model, cfg)
    # modules ["conv"]: the convolutions only (type, not isinstance: compressed layers subclass)
    assert isinstance(model.conv1, Conv2dLayer_Compress) and type(model.fc) is torch.nn.Linear
    seen = []
    model.conv2.register_forward_pre_hook(lambda m, args: seen.append(args[0]))
    model(torch.randn(2, 3, 5, 40))  # rows of 40: 8 bits would give more than 16 values
    quantized = model.conv2.quantize_input(seen[0])
    per_row = quantized.reshape(-1, quantized.shape[-1])
    assert max(row.unique().numel() for row in per_row) <= 16


def test_static_activation_range_tracks_training_inputs():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4))
    init_compression(model, section(activation_quantization=(
        {"range_calibration": "static"}, {"aq1": group(["0"], bits=8)})))
    model.train()
    model(torch.full((2, 4), 3.0) * torch.tensor([[1.0], [-1.0]]))
    torch.testing.assert_close(model[0].activation_range, torch.tensor([-3.0, 3.0]))
    model(torch.full((2, 4), 1.0) * torch.tensor([[1.0], [-1.0]]))
    torch.testing.assert_close(model[0].activation_range, torch.tensor([-2.9, 2.9]))


def test_l1_sparse_mask_keeps_exactly_the_largest_half():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(10, 6))
    weight = model[0].weight.detach().clone()
    init_compression(model, section(sparse_pruning=({"method": "l1"},
                                                    {"sp1": group(["0"], dense_ratio=0.5)})))
    effective, _ = model[0].effective_weight_and_bias()
    kept = effective != 0
    assert kept.sum() == 30
    assert weight.abs()[kept].min() >= weight.abs()[~kept].max()


def test_topk_sparse_mask_follows_learnable_scores():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(10, 6))
    init_compression(model, section(sparse_pruning=({"method": "topk"},
                                                    {"sp1": group(["0"], dense_ratio=0.3)})))
    layer = model[0]
    with torch.no_grad():
        layer.sparse_mask_scores.copy_(torch.arange(60.0).reshape(6, 10))
    effective, _ = layer.effective_weight_and_bias()
    assert (effective.reshape(-1)[:42] == 0).all() and (effective.reshape(-1)[42:] != 0).all()
    model(torch.randn(4, 10)).sum().backward()
    assert layer.sparse_mask_scores.grad is not None and layer.sparse_mask_scores.grad.abs().sum() > 0


def test_row_head_and_channel_masks_have_the_documented_pattern():
    model = tiny_bert(heads=4)
    init_compression(model, section(
        row_pruning=({"method": "l1"}, {"rp1": group(["intermediate.dense"],
                                                     [["layer.\\w+.output.dense"]],
                                                     dense_ratio=0.5)}),
        head_pruning=({"num_heads": 4}, {"hp1": group(["attention.output.dense"],
                                                      [["self.query", "self.key", "self.value"]],
                                                      dense_ratio=0.5)})))
    layer = model.bert.encoder.layer[0]
    rows = layer.intermediate.dense.row_mask()
    assert rows.shape == (64,) and rows.sum() == 32
    weight, bias = layer.intermediate.dense.effective_weight_and_bias()
    assert (weight[rows == 0] == 0).all() and (bias[rows == 0] == 0).all()
    columns = layer.attention.output.dense.column_mask().reshape(4, 8)
    assert columns.sum() == 16 and all(block.unique().numel() == 1 for block in columns)
    assert layer.intermediate.dense.plan["row_pruning"]["related"] == \
        ["bert.encoder.layer.0.output.dense"]
    assert layer.attention.output.dense.plan["head_pruning"]["related"] == [
        f"bert.encoder.layer.0.attention.self.{p}" for p in ("query", "key", "value")]

    cnn = TinyCNN()
    init_compression(cnn, section(channel_pruning=(
        {"method": "l1"}, {"cp1": group(["conv1"], [["conv2"]], dense_ratio=0.25)})))
    channels = cnn.conv1.row_mask()
    assert channels.sum() == 2 and (cnn.conv1.effective_weight_and_bias()[0][channels == 0] == 0).all()


def test_pruned_weights_stay_zero_through_training():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
    init_compression(model, section(
        sparse_pruning=({"method": "l1"}, {"sp1": group(["2"], dense_ratio=0.5)}),
        row_pruning=({"method": "l1"}, {"rp1": group(["0"], [["2"]], dense_ratio=0.25)})))
    sparse_zero = model[2].sparse_pruning_mask == 0
    rows_zero = model[0].row_pruning_mask == 0
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.05, weight_decay=0.1)
    scheduler = compression_scheduler(model)
    for step in range(1, 6):
        loss = model(torch.randn(4, 8)).pow(2).mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        scheduler.step(step)
        assert (model[2].weight[sparse_zero] == 0).all()
        assert (model[0].weight[rows_zero] == 0).all() and (model[0].bias[rows_zero] == 0).all()


def test_head_pruning_needs_divisible_heads():
    model = tiny_bert(heads=4)
    with pytest.raises(ValueError, match="num_heads=3"):
        init_compression(model, section(head_pruning=(
            {"num_heads": 3}, {"hp1": group(["attention.output.dense"], dense_ratio=0.5)})))


def test_excluded_modules_are_not_pruned():
    model = tiny_bert()
    init_compression(model, section(sparse_pruning=(
        {"method": "l1", "excluded_modules": ["layer.1"]},
        {"sp1": group(["attention.self"], dense_ratio=0.5)})))
    assert isinstance(model.bert.encoder.layer[0].attention.self.query, LinearLayer_Compress)
    assert type(model.bert.encoder.layer[1].attention.self.query) is torch.nn.Linear


def test_related_modules_pair_with_their_module_pattern():
    model = TinyCNN()
    init_compression(model, section(channel_pruning=(
        {"method": "l1"}, {"cp1": group(["conv1", "conv2"], [["conv2"], ["fc"]],
                                        dense_ratio=0.5)})))
    assert model.conv1.plan["channel_pruning"]["related"] == ["conv2"]
    assert model.conv2.plan["channel_pruning"]["related"] == ["fc"]
    with pytest.raises(ValueError, match="cp1.related_modules has 2 lists for 3 module"):
        init_compression(TinyCNN(), section(channel_pruning=(
            {"method": "l1"}, {"cp1": group(["conv1", "conv2", "conv3"], [["conv2"], ["fc"]],
                                            dense_ratio=0.5)})))
