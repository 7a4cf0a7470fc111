"""``ds_to_universal`` of an AutoTP checkpoint (issue 36): the tensor-parallel ranks' pieces of
every split weight are joined into whole tensors, and the universal checkpoint resumes the run
without tensor parallelism (data-parallel 2, ZeRO-1) with the losses of the uninterrupted run."""
import os

import pytest
import torch

pytest.importorskip("transformers")

TAG = "two"


def _step(engine, ids):
    loss = engine(input_ids=ids, labels=ids).loss
    engine.backward(loss)
    engine.step()
    return loss


def _save_tp2(save_dir):
    import deepspeed
    from tp_train_helpers import ds_config, global_batches, registered_groups_restored, \
        tiny_llama

    with registered_groups_restored():
        batches = global_batches(4, 1)
        model = deepspeed.tp_model_init(tiny_llama(), tp_size=2, dtype=torch.float32)
        engine = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                      config=ds_config(2, 1))[0]
        for ids in batches[:2]:
            _step(engine, ids)
        engine.save_checkpoint(save_dir, tag=TAG)
        losses = [_step(engine, ids).item() for ids in batches[2:]]
        engine.destroy()
    return losses


def _resume_dp2(universal_dir):
    import deepspeed
    import deepspeed.comm as dist
    from tp_train_helpers import MICRO, ds_config, dp_mean, global_batches, tiny_llama

    config = ds_config(1, 1, train_micro_batch_size_per_gpu=MICRO // 2,
                       checkpoint={"load_universal": True})
    model = tiny_llama(seed=7)  # other initial weights: they must come from the checkpoint
    engine = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                  config=config)[0]
    engine.load_checkpoint(universal_dir, tag=TAG)
    steps, rank, losses = engine.global_steps, dist.get_rank(), []
    for ids in global_batches(4, 1)[2:]:
        mine = ids[rank * (MICRO // 2):(rank + 1) * (MICRO // 2)]
        losses.append(dp_mean(_step(engine, mine).item(), None))
    engine.destroy()
    return steps, losses


def test_autotp_checkpoint_converts_and_resumes_without_tensor_parallelism(dist_pool,
                                                                           tmp_path):
    from deepspeed.checkpoint import load_file
    from deepspeed.checkpoint.ds_to_universal import convert
    from deepspeed.checkpoint.universal import load_param_state, read_info

    expected = dist_pool.run(_save_tp2, world_size=2, args=(str(tmp_path / "tp2"),))[0]
    out = convert(str(tmp_path / "tp2"), str(tmp_path / "universal"), num_extract_workers=1,
                  num_merge_workers=1)
    info = read_info(out)
    assert info["source"]["tensor_parallel_size"] == 2
    q = "model.layers.0.self_attn.q_proj.weight"
    assert info["param_shapes"][q] == [32, 32]  # joined from two [16, 32] pieces
    pieces = [load_file(tmp_path / "tp2" / TAG / f"mp_rank_0{t}_model_states.pt")
              for t in range(2)]
    assert [p["param_slices"][q] for p in pieces] == [[0, 2, 0], [0, 2, 1]]
    assert torch.equal(load_param_state(out, q),
                       torch.cat([p["module"][q] for p in pieces], 0).float())
    assert sorted(f for f in os.listdir(out) if f.endswith("_model_states.pt")) == \
        ["mp_rank_00_model_states.pt"]

    for steps, losses in dist_pool.run(_resume_dp2, world_size=2,
                                       args=(str(tmp_path / "universal"),)):
        assert steps == 2
        assert losses == pytest.approx(expected, abs=1e-5, rel=0)
