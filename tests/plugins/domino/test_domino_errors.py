"""Domino without tensor parallelism, and shapes it cannot split, fail at construction with
the fix named."""
import pytest

from deepspeed.testing import run_distributed

SHAPE = dict(hidden_size=32, num_attention_heads=4, ffn_hidden_size=64)


def test_without_a_process_group_it_names_init_distributed():
    from deepspeed.domino import DominoTransformerLayer

    with pytest.raises(RuntimeError, match="init_distributed"):
        DominoTransformerLayer(SHAPE)


def test_config_errors_name_the_key():
    from deepspeed.domino import DominoConfig

    with pytest.raises(ValueError, match="num_attention_heads"):
        DominoConfig(hidden_size=30, num_attention_heads=4)
    with pytest.raises(ValueError, match="hidden_sise"):
        DominoConfig(hidden_sise=32, num_attention_heads=4)
    assert DominoConfig(hidden_size=8, num_attention_heads=2).ffn_hidden_size == 32


def _errors_on_two_ranks():
    from deepspeed.domino import DominoTransformer, DominoTransformerLayer
    from deepspeed.utils import groups

    previous = groups.mpu
    try:
        groups.set_mpu(None)
        with pytest.raises(RuntimeError, match="no tensor parallelism.*init_tensor_parallel_groups"):
            DominoTransformer(dict(SHAPE, num_layers=2))
        groups.init_tensor_parallel_groups(1)
        with pytest.raises(ValueError, match="tensor-parallel size of at least 2, got 1"):
            DominoTransformerLayer(SHAPE)
        groups.init_tensor_parallel_groups(2)
        with pytest.raises(ValueError, match="num_attention_heads=3 is not divisible"):
            DominoTransformerLayer(dict(SHAPE, hidden_size=33, num_attention_heads=3))
        with pytest.raises(ValueError, match="num_chunks must be a positive int"):
            DominoTransformerLayer(SHAPE, num_chunks=0)
        # a batch of one cannot be halved: it runs as one piece
        layer = DominoTransformerLayer(SHAPE)
        import torch
        assert layer(torch.randn(1, 4, 32)).shape == (1, 4, 32)
    finally:
        groups.set_mpu(previous)


def test_without_tensor_parallelism_it_refuses_to_build():
    run_distributed(_errors_on_two_ranks, world_size=2, timeout=600)
