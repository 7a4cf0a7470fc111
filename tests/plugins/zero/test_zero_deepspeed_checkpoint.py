"""``deepspeed.checkpoint.DeepSpeedCheckpoint`` and ``deepspeed.checkpoint.constants`` on
folders this package wrote: a 2-stage pipeline with ZeRO-1 and a 2-rank ZeRO-2 run (one 2-rank
call saves both)."""
import os
import re

import pytest
import torch

TAG = "global_step2"


def _save_both(root):
    import deepspeed
    from deepspeed.pipe import LayerSpec, PipelineModule

    def mse(out, labels):
        return torch.nn.functional.mse_loss(out, labels)

    torch.manual_seed(0)
    layers = [LayerSpec(torch.nn.Linear, 4, 8), LayerSpec(torch.nn.Tanh),
              LayerSpec(torch.nn.Linear, 8, 4)]
    pipe = PipelineModule(layers, num_stages=2, loss_fn=mse, partition_method="uniform")
    config = {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1,
              "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "torch_adam": True}},
              "zero_optimization": {"stage": 1}}
    engine, *_ = deepspeed.initialize(model=pipe, model_parameters=pipe.parameters(),
                                      config=config)
    batch = [(torch.ones(2, 4), torch.zeros(2, 4))]
    for _ in range(2):
        engine.train_batch(iter(batch))
    engine.save_checkpoint(os.path.join(root, "pipe"), tag=TAG)
    engine.destroy()

    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 4))
    engine, *_ = deepspeed.initialize(model=model, config={
        **config, "zero_optimization": {"stage": 2}})
    for _ in range(2):
        engine.backward(engine(torch.ones(2, 4)).pow(2).mean())
        engine.step()
    engine.save_checkpoint(os.path.join(root, "zero2"), tag=TAG)
    engine.destroy()


@pytest.fixture(scope="module")
def saved(dist_pool, tmp_path_factory):
    root = str(tmp_path_factory.mktemp("ds_checkpoint"))
    dist_pool.run(_save_both, args=(root,))
    return root


def test_pipeline_checkpoint_degrees_and_layer_files(saved):
    from deepspeed.checkpoint import DeepSpeedCheckpoint
    from deepspeed.checkpoint.constants import (LAYER_FILE_PREFIX, LAYER_FILE_PREFIX_PATTERN,
                                                MODEL_FILE_PREFIX, PARTITION_COUNT,
                                                ZERO_FILE_PREFIX)

    ckpt = DeepSpeedCheckpoint(os.path.join(saved, "pipe", TAG))
    assert (ckpt.original_tp_degree, ckpt.original_pp_degree, ckpt.original_dp_degree) == (1, 2, 1)
    assert ckpt.world_size == ckpt.original_world_size == 2
    assert ckpt.layer_keys == ["layer_00", "layer_01", "layer_02"] and ckpt.layer_count == 3
    for path in ckpt.layer_files:
        name = os.path.basename(path)
        assert name.startswith(LAYER_FILE_PREFIX) and re.match(LAYER_FILE_PREFIX_PATTERN, name)
    assert ckpt.get_layer_files("layer_02") == [os.path.join(saved, "pipe", TAG,
                                                             "layer_02-model_states.pt")]
    assert [os.path.basename(p) for p in ckpt.mp_rank_files] == \
        [f"{MODEL_FILE_PREFIX}00_model_states.pt", f"{MODEL_FILE_PREFIX}01_model_states.pt"]
    assert all(os.path.basename(p).startswith(ZERO_FILE_PREFIX) for p in ckpt.zero_files)
    assert ckpt.get_iteration() == 2
    # stage 1's own files: its model states and its ZeRO partition
    assert ckpt.get_2d_parallel_state(tp_index=0, pp_index=1)["pipeline_stages"] == 2
    assert ckpt.get_zero_checkpoint_state(pp_index=1, tp_index=0, dp_index=0)[PARTITION_COUNT] == 1
    assert not (ckpt.is_change_pp_degree() or ckpt.is_change_tp_degree())
    resized = DeepSpeedCheckpoint(os.path.join(saved, "pipe", TAG), pp_degree=1)
    assert resized.is_change_pp_degree() and resized.world_size == 1
    with pytest.raises(ValueError, match="ds_to_universal"):
        resized.get_2d_parallel_state(0, 0)


def test_data_parallel_zero_checkpoint(saved):
    from deepspeed.checkpoint.constants import (OPTIM_FILE_SUFFIX, PARTITION_COUNT,
                                                SINGLE_PARTITION_OF_FP32_GROUPS, ZERO_STAGE)
    from deepspeed.checkpoint.deepspeed_checkpoint import DeepSpeedCheckpoint

    ckpt = DeepSpeedCheckpoint(os.path.join(saved, "zero2", TAG))
    assert (ckpt.original_tp_degree, ckpt.original_pp_degree, ckpt.original_dp_degree) == (1, 1, 2)
    assert ckpt.layer_keys == [] and len(ckpt.zero_files) == 2
    assert all(p.endswith(OPTIM_FILE_SUFFIX) for p in ckpt.zero_files)
    states = [ckpt.get_zero_checkpoint_state(0, 0, dp) for dp in range(2)]
    assert [s[PARTITION_COUNT] for s in states] == [2, 2] and states[0][ZERO_STAGE] == 2
    # the two partitions together hold every trained element once (plus padding)
    total = sum(p.numel() for s in states for p in s[SINGLE_PARTITION_OF_FP32_GROUPS])
    assert total >= 4 * 8 + 8 + 8 * 4 + 4
    assert ckpt.is_change_dp_degree() is False and "dp=2" in repr(ckpt)
    with pytest.raises(ValueError, match="dp_index 2"):
        ckpt.get_zero_checkpoint_state(0, 0, 2)


def test_a_folder_that_is_no_checkpoint_is_named(tmp_path):
    from deepspeed.checkpoint import CheckpointFormatError, DeepSpeedCheckpoint

    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(CheckpointFormatError, match="notes.txt"):
        DeepSpeedCheckpoint(str(tmp_path))
    with pytest.raises(FileNotFoundError, match="does not exist"):
        DeepSpeedCheckpoint(str(tmp_path / "missing"))
