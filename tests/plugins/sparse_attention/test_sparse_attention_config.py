"""The ``sparse_attention`` section builds the pattern of its mode; bad sections fail at
``deepspeed.initialize`` naming the key; ds_report shows the op's status with a reason."""
import re

import pytest
import torch

import deepspeed
from deepspeed.testing.distributed import run_distributed
from deepspeed.sparse_attention import (BigBirdSparsityConfig, BSLongformerSparsityConfig,
                                        DenseSparsityConfig, FixedSparsityConfig,
                                        VariableSparsityConfig, get_sparse_attention_config)

DOCS_EXAMPLE = {"mode": "fixed", "block": 16, "different_layout_per_head": True,
                "num_local_blocks": 4, "num_global_blocks": 1, "attention": "bidirectional",
                "horizontal_global_attention": False, "num_different_global_patterns": 4,
                "num_random_blocks": 0, "local_window_blocks": [4], "global_block_indices": [0],
                "global_block_end_indices": None, "num_sliding_window_blocks": 3}


def test_the_documented_example_builds_the_fixed_pattern():
    cfg = get_sparse_attention_config({"sparse_attention": DOCS_EXAMPLE}, num_heads=8)
    assert isinstance(cfg, FixedSparsityConfig)
    want = FixedSparsityConfig(8, block=16, different_layout_per_head=True, num_local_blocks=4,
                               num_global_blocks=1, num_different_global_patterns=4)
    assert torch.equal(cfg.make_layout(256), want.make_layout(256))


@pytest.mark.parametrize("section,cls,attrs", [
    ({"mode": "dense", "block": 32}, DenseSparsityConfig, {"block": 32}),
    ({"mode": "bigbird", "num_random_blocks": 2, "num_sliding_window_blocks": 5, "num_global_blocks": 2},
     BigBirdSparsityConfig, {"num_random_blocks": 2, "num_sliding_window_blocks": 5, "num_global_blocks": 2}),
    ({"mode": "bslongformer", "global_block_indices": [0, 4], "global_block_end_indices": [2, 6]},
     BSLongformerSparsityConfig, {"global_block_indices": [0, 4], "global_block_end_indices": [2, 6]}),
    ({"mode": "variable", "local_window_blocks": [2, 4], "attention": "unidirectional"},
     VariableSparsityConfig, {"local_window_blocks": [2, 4], "attention": "unidirectional"}),
    ({}, FixedSparsityConfig, {"num_local_blocks": 4, "block": 16}),
    ({"mode": "fixed", "num_local_blocks": 8, "num_global_blocks": 2,
      "different_layout_per_head": True, "num_different_global_patterns": 2,
      "horizontal_global_attention": True}, FixedSparsityConfig,
     {"num_local_blocks": 8, "num_global_blocks": 2, "different_layout_per_head": True,
      "num_different_global_patterns": 2, "horizontal_global_attention": True}),
])
def test_each_mode(section, cls, attrs):
    cfg = get_sparse_attention_config(section, num_heads=2)
    assert type(cfg) is cls and cfg.num_heads == 2
    for key, value in attrs.items():
        assert getattr(cfg, key) == value


def test_unknown_mode_and_bad_combinations():
    with pytest.raises(ValueError, match="mode"):
        get_sparse_attention_config({"mode": "sparse"}, 2)
    with pytest.raises(ValueError, match="sparse_attention \\(mode 'fixed'\\): .*different_layout_per_head"):
        get_sparse_attention_config({"mode": "fixed", "num_different_global_patterns": 2}, 2)
    with pytest.raises(ValueError, match="no 'sparse_attention' section"):
        get_sparse_attention_config({"train_batch_size": 1}, 2)


def _config(section):
    return {"train_micro_batch_size_per_gpu": 1, "steps_per_print": 10 ** 6,
            "optimizer": {"type": "SGD", "params": {"lr": 0.1}}, "sparse_attention": section}


def _engine_answers_and_refusals():
    """In a worker: ``initialize`` brings up the distributed backend, which must not stay up
    in the pytest process."""
    model = torch.nn.Linear(4, 4)
    engine, *_ = deepspeed.initialize(model=model, config=_config({"mode": "bslongformer"}),
                                      model_parameters=model.parameters())
    answers = [engine.config.section("sparse_attention").mode,
               type(get_sparse_attention_config(engine, 4)).__name__]
    for section in ({"mode": "strided"}, {"nmu_local_blocks": 4},
                    {"attention": "unidirectional", "horizontal_global_attention": True}):
        try:
            deepspeed.initialize(model=model, config=_config(section),
                                 model_parameters=model.parameters())
        except Exception as err:  # the test asserts on each type and message
            answers.append((type(err).__name__, str(err)))
        else:
            answers.append(None)
    return answers


def test_engine_answers_the_model_and_refuses_bad_sections():
    mode, cls, strided, misspelt, horizontal = run_distributed(_engine_answers_and_refusals,
                                                               world_size=1)[0]
    assert (mode, cls) == ("bslongformer", BSLongformerSparsityConfig.__name__)
    assert strided is not None and re.search("sparse_attention.*mode", strided[1]), strided
    assert misspelt is not None and re.search("num_local_blocks|nmu_local_blocks",
                                              misspelt[1]), misspelt
    assert horizontal is not None and horizontal[0] == "ValueError" \
        and "horizontal_global_attention" in horizontal[1], horizontal


def test_ds_report_shows_the_op_and_why():
    from deepspeed.env_report import op_report

    lines = op_report([])
    row = next(i for i, line in enumerate(lines) if line.startswith("sparse_attn"))
    if lines[row].rstrip().endswith("[NO]"):
        assert "reason: " in lines[row + 1] and ("triton" in lines[row + 1] or "CUDA" in lines[row + 1])
    else:
        assert torch.cuda.is_available()


def test_op_builder_is_not_prebuilt():
    from deepspeed.ops.op_builder import SparseAttnBuilder
    from deepspeed.ops.op_builder.aot import select_ops

    selected, skipped = select_ops([SparseAttnBuilder], {"DS_BUILD_SPARSE_ATTN": "1"})
    assert not selected and skipped[0][0] == "sparse_attn" and "Triton" in skipped[0][1]
