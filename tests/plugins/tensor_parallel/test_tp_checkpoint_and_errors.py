"""AutoTP training checkpoints and bad input.

- TP 2 x DP 2 with ZeRO-1: ``save_checkpoint`` writes one model-states file per
  tensor-parallel rank (``mp_rank_00`` / ``mp_rank_01``, holding that rank's shards) and ZeRO
  files per (dp, mp) rank; a fresh engine that loads it continues with the losses and weights
  of the uninterrupted run.
- A config with ``tensor_parallel.autotp_size`` splits the model at ``deepspeed.initialize``
  without ``tp_model_init``.
- Errors: a tp_size that does not divide the world size or the heads, a config disagreeing
  with ``tp_model_init``, ZeRO-3, kernel injection, unknown keys, unexpected kwargs."""
import os

import pytest
import torch

from deepspeed.testing import run_distributed

pytest.importorskip("transformers")

LR, CLIP = 1e-2, 0.05


def _step(engine, ids, micro):
    dp_rank = engine.mpu.get_data_parallel_rank()
    mine = ids[dp_rank * micro:(dp_rank + 1) * micro]
    loss = engine(input_ids=mine, labels=mine).loss
    engine.backward(loss)
    engine.step()
    return loss.item()


def _resume(save_dir):
    import deepspeed
    import deepspeed.comm as dist
    from tp_train_helpers import MICRO, ds_config, global_batches, registered_groups_restored, \
        tiny_llama

    with registered_groups_restored():
        batches = global_batches(4, 2)
        config = ds_config(2, 1, LR, CLIP)

        def build(seed):
            model = deepspeed.tp_model_init(tiny_llama(seed=seed), tp_size=2, dtype=torch.float32)
            return deepspeed.initialize(model=model, config=config,
                                        model_parameters=model.parameters())[0]

        engine = build(0)
        for ids in batches[:2]:
            _step(engine, ids, MICRO)
        engine.save_checkpoint(save_dir, tag="two")
        after = [_step(engine, ids, MICRO) for ids in batches[2:]]
        want = {k: v.clone() for k, v in engine.module.state_dict().items()}
        engine.destroy()

        files = sorted(os.listdir(os.path.join(save_dir, "two")))
        assert "mp_rank_00_model_states.pt" in files and "mp_rank_01_model_states.pt" in files
        assert len([f for f in files if f.endswith("_optim_states.pt")]) == 4
        mp_rank = dist.get_rank() % 2
        saved = torch.load(os.path.join(save_dir, "two", f"mp_rank_0{mp_rank}_model_states.pt"),
                           weights_only=True)["module"]
        assert saved["model.layers.0.self_attn.q_proj.weight"].shape == (16, 32)

        resumed = build(5)  # other initial weights: they must come from the checkpoint
        resumed.load_checkpoint(save_dir, tag="two")
        again = [_step(resumed, ids, MICRO) for ids in batches[2:]]
        torch.testing.assert_close(torch.tensor(again), torch.tensor(after), atol=1e-6, rtol=1e-6)
        for name, value in resumed.module.state_dict().items():
            torch.testing.assert_close(value, want[name], atol=1e-6, rtol=1e-6)
        resumed.destroy()


def test_checkpoint_per_tp_rank_resumes_the_same_run(tmp_path):
    run_distributed(_resume, world_size=4, args=(str(tmp_path),), timeout=240)


def _config_alone_splits_at_initialize():
    import deepspeed
    from deepspeed.tensor_parallel import RowParallelLinear, split_of
    from tp_train_helpers import MICRO, ds_config, global_batches, registered_groups_restored, \
        tiny_llama, train_reference

    with registered_groups_restored():
        model = tiny_llama()
        batches = global_batches(2, 1)
        ref_losses, _, _ = train_reference(model, batches, LR, CLIP)
        engine = deepspeed.initialize(model=model, config=ds_config(2, 0, LR, CLIP),
                                      model_parameters=model.parameters())[0]
        assert split_of(engine.module).tp_size == 2
        assert isinstance(engine.module.model.layers[0].mlp.down_proj, RowParallelLinear)
        # model.parameters() was listed before the split: the optimizer must still step the
        # split weights (the same Parameter objects), or the losses drift from the reference
        losses = [_step(engine, ids, MICRO) for ids in batches]
        torch.testing.assert_close(torch.tensor(losses), torch.tensor(ref_losses),
                                   atol=1e-5, rtol=1e-5)
        engine.destroy()


def test_config_alone_splits_the_model_at_initialize():
    run_distributed(_config_alone_splits_at_initialize, world_size=2, timeout=180)


class TinyMPU:
    """Some other model-parallel unit (pure data parallel over the world)."""

    def get_data_parallel_group(self):
        return None

    def get_data_parallel_world_size(self):
        return 2


def _errors():
    import deepspeed
    from deepspeed.inference.auto_tp import TensorParallelError
    from tp_train_helpers import ds_config, registered_groups_restored, tiny_llama

    with registered_groups_restored():
        with pytest.raises(ValueError, match="tensor parallel size 4 does not divide the world "
                                             "size 2"):
            deepspeed.tp_model_init(tiny_llama(), tp_size=4, dtype=torch.float32)
        with pytest.raises(TensorParallelError, match="tp_size=2 does not divide "
                                                      "num_attention_heads=3"):
            deepspeed.tp_model_init(tiny_llama(heads=3, kv_heads=3, hidden=36), tp_size=2,
                                    dtype=torch.float32)
        with pytest.raises(ValueError, match="disagrees with the config's "
                                             "tensor_parallel.autotp_size=4"):
            deepspeed.tp_model_init(tiny_llama(), tp_size=2, dtype=torch.float32,
                                    config=ds_config(4))
        with pytest.raises(TypeError, match=r"unexpected keyword arguments \['mp_size'\]"):
            deepspeed.tp_model_init(tiny_llama(), tp_size=2, dtype=torch.float32, mp_size=2)
        model = deepspeed.tp_model_init(tiny_llama(), tp_size=2, dtype=torch.float32)
        with pytest.raises(NotImplementedError, match="ZeRO stage 3"):
            deepspeed.initialize(model=model, config=ds_config(2, 3),
                                 model_parameters=model.parameters())
        with pytest.raises(ValueError, match="autotp_size=4, but the model was split over 2"):
            deepspeed.initialize(model=model, config=ds_config(4),
                                 model_parameters=model.parameters())
        with pytest.raises(ValueError, match="was given its own mpu"):
            deepspeed.initialize(model=model, config=ds_config(2), mpu=TinyMPU(),
                                 model_parameters=model.parameters())
        assert model.model.layers[0].self_attn.q_proj.weight.shape == (16, 32)  # split once


def test_bad_tensor_parallel_input_is_a_clear_error():
    run_distributed(_errors, world_size=2, timeout=180)


def test_section_validation():
    from deepspeed.config import DeepSpeedConfig, DeepSpeedConfigError

    base = {"train_batch_size": 2}
    config = DeepSpeedConfig({**base, "tensor_parallel": {"autotp_size": 2}}, world_size=2)
    assert config.section("tensor_parallel").autotp_size == 2
    assert DeepSpeedConfig({**base, "tensor_parallel": {}}, world_size=2).section(
        "tensor_parallel").autotp_size == 0
    for bad, message in [({"autotp_size": -1}, "autotp_size"),
                         ({"replace_with_kernel_inject": True}, "replace_with_kernel_inject"),
                         ({"autotp_sz": 2}, "autotp_sz"),
                         ({"tensor_parallel": {"tp_size": 2}}, "autotp_size")]:
        with pytest.raises(DeepSpeedConfigError, match=message):
            DeepSpeedConfig({**base, "tensor_parallel": bad}, world_size=2)


def test_a_split_that_freezes_weights_is_refused():
    """A layer AutoTP might split that training has no counterpart for (say an inference-only
    vocab-parallel embedding with frozen weights) fails loudly instead of training wrong."""
    from torch import nn

    from deepspeed.tensor_parallel.shard import _check_still_trainable

    model = nn.Sequential(nn.Embedding(4, 2), nn.Linear(2, 2))
    _check_still_trainable(model, {"0.weight", "1.weight", "1.bias"})
    model[0].weight.requires_grad_(False)
    with pytest.raises(NotImplementedError, match=r"Embedding.*\['0.weight'\]"):
        _check_still_trainable(model, {"0.weight", "1.weight", "1.bias"})
