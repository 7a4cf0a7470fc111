"""redundancy_clean yields plain, physically smaller layers computing what the masked model
computed; layer reduction initialises the student from the chosen teacher layers."""
import pytest
import torch
from cp_helpers import TinyCNN, group, section, tiny_bert

from deepspeed.compression.basic_layer import CompressionState
from deepspeed.compression.compress import init_compression, redundancy_clean


def _ids(seed=0):
    return torch.randint(0, 50, (3, 7), generator=torch.Generator().manual_seed(seed))


def _no_compressed_layers(model):
    return not any(isinstance(m, CompressionState) for m in model.modules())


def test_row_and_head_pruning_shrink_bert_with_equal_outputs():
    model = tiny_bert(heads=4, intermediate=64)
    cfg = section(
        row_pruning=({"method": "l1"}, {"rp1": group(["intermediate.dense"],
                                                     [["layer.\\w+.output.dense"]],
                                                     dense_ratio=0.5)}),
        head_pruning=({"num_heads": 4}, {"hp1": group(["attention.output.dense"],
                                                      [["self.query", "self.key", "self.value"]],
                                                      dense_ratio=0.5)}),
        weight_quantization=({"quantize_weight_in_forward": True, "quantize_groups": 4},
                             {"wq1": group(["attention.self", "intermediate", "output.dense"],
                                           start_bits=8, target_bits=8)}))
    init_compression(model, cfg)
    ids = _ids()
    masked = model(input_ids=ids).logits
    redundancy_clean(model, cfg)
    assert _no_compressed_layers(model)
    for layer in model.bert.encoder.layer:
        assert layer.intermediate.dense.out_features == 32
        assert layer.output.dense.in_features == 32
        assert layer.attention.output.dense.in_features == 16
        assert layer.attention.self.query.out_features == 16
        assert layer.attention.self.num_attention_heads == 2
    torch.testing.assert_close(model(input_ids=ids).logits, masked, atol=1e-5, rtol=1e-5)


def test_quantized_weights_are_baked_on_the_grid():
    model = torch.nn.Sequential(torch.nn.Linear(16, 8))
    cfg = section(weight_quantization=({"quantize_weight_in_forward": True, "quantize_groups": 2},
                                       {"wq1": group(["0"], start_bits=4, target_bits=4)}))
    init_compression(model, cfg)
    x = torch.randn(3, 16)
    before = model(x)
    redundancy_clean(model, cfg)
    assert type(model[0]) is torch.nn.Linear
    assert max(r.unique().numel() for r in model[0].weight.detach().reshape(2, -1)) <= 16
    torch.testing.assert_close(model(x), before)


def test_channel_pruning_shrinks_the_next_conv():
    model = TinyCNN(bn=False)
    cfg = section(channel_pruning=({"method": "l1"},
                                   {"cp1": group(["conv1"], [["conv2"]], dense_ratio=0.5)}))
    init_compression(model, cfg)
    x = torch.randn(2, 3, 6, 6)
    masked = model(x)
    redundancy_clean(model, cfg)
    assert model.conv1.out_channels == 4 and model.conv1.weight.shape == (4, 3, 3, 3)
    assert model.conv2.in_channels == 4 and model.conv2.weight.shape == (6, 4, 3, 3)
    torch.testing.assert_close(model(x), masked)


def test_channel_pruning_shrinks_batchnorm_too():
    model = TinyCNN(bn=True)
    cfg = section(channel_pruning=({"method": "topk"},
                                   {"cp1": group(["conv1"], [["conv2", "bn1"]],
                                                 dense_ratio=0.5)}))
    init_compression(model, cfg)
    redundancy_clean(model, cfg)
    assert model.bn1.num_features == 4 and model.bn1.running_mean.shape == (4,)
    assert model(torch.randn(2, 3, 6, 6)).shape == (2, 2)


def test_sparse_pruning_bakes_zeros():
    model = torch.nn.Sequential(torch.nn.Linear(10, 6))
    cfg = section(sparse_pruning=({"method": "topk"}, {"sp1": group(["0"], dense_ratio=0.5)}))
    init_compression(model, cfg)
    x = torch.randn(2, 10)
    before = model(x)
    redundancy_clean(model, cfg)
    assert (model[0].weight == 0).sum() == 30
    torch.testing.assert_close(model(x), before)


LR = {"enabled": True, "keep_number_layer": 2, "module_name_prefix": "bert.encoder.layer",
      "teacher_layer": [1, 3], "other_module_name": ["bert.pooler", "bert.embeddings",
                                                      "classifier"]}


def test_layer_reduction_copies_the_chosen_teacher_layers():
    teacher = tiny_bert(layers=4, seed=1)
    student = tiny_bert(layers=2, seed=2)
    init_compression(student, {"compression_training": {"layer_reduction": LR}},
                     teacher_model=teacher)
    for student_index, teacher_index in enumerate(LR["teacher_layer"]):
        s = student.bert.encoder.layer[student_index].state_dict()
        t = teacher.bert.encoder.layer[teacher_index].state_dict()
        assert all(torch.equal(s[k], t[k]) for k in t)
    for name in ("bert.pooler", "bert.embeddings", "classifier"):
        s = student.get_submodule(name).state_dict()
        t = teacher.get_submodule(name).state_dict()
        assert all(torch.equal(s[k], t[k]) for k in t)


def test_layer_reduction_errors_name_the_key():
    student = tiny_bert(layers=2)
    with pytest.raises(ValueError, match="teacher_model"):
        init_compression(student, {"compression_training": {"layer_reduction": LR}})
    with pytest.raises(ValueError, match="keep_number_layer is 3"):
        init_compression(student, {"compression_training": {"layer_reduction": {
            **LR, "keep_number_layer": 3, "teacher_layer": [0, 1, 2]}}},
            teacher_model=tiny_bert(layers=4))
    with pytest.raises(ValueError, match="teacher_layer names layer 9"):
        init_compression(student, {"compression_training": {"layer_reduction": {
            **LR, "teacher_layer": [0, 9]}}}, teacher_model=tiny_bert(layers=4))


def test_int8_packing_round_trips_a_cleaned_model_exactly(tmp_path):
    from deepspeed.compression.export import pack_int8, unpack_int8

    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    cfg = section(weight_quantization=({"quantize_weight_in_forward": True, "quantize_groups": 4},
                                       {"wq1": group(["0", "2"], start_bits=8, target_bits=8)}))
    init_compression(model, cfg)
    redundancy_clean(model, cfg)
    packed = pack_int8(model.state_dict(), num_groups=4)
    assert packed["0.weight.int8_levels"].dtype == torch.int8 and "0.bias" in packed
    torch.save(packed, tmp_path / "int8.pt")
    torch.save(model.state_dict(), tmp_path / "fp32.pt")
    assert (tmp_path / "int8.pt").stat().st_size < (tmp_path / "fp32.pt").stat().st_size
    restored = unpack_int8(torch.load(tmp_path / "int8.pt", weights_only=True))
    for name, tensor in model.state_dict().items():
        torch.testing.assert_close(restored[name], tensor, atol=0, rtol=1e-6)


def test_standalone_student_initialization_matches_init_compression():
    from deepspeed.compression.compress import student_initialization

    teacher = tiny_bert(layers=4, seed=1)
    student = student_initialization(tiny_bert(layers=2, seed=2), teacher,
                                     {"compression_training": {"layer_reduction": LR}})
    assert torch.equal(student.bert.encoder.layer[1].output.dense.weight,
                       teacher.bert.encoder.layer[3].output.dense.weight)
