"""ZeRO stage 1/2 checkpoints: per-rank optimizer partitions, exact resume, re-partitioning."""
import os

import pytest
import torch

from zero_models import ds_config, make_model, param_groups, reference_phases, train

GAS = 2


def _engine(stage, **zero):
    import deepspeed

    torch.manual_seed(123)  # a different init: everything must come from the checkpoint
    model = make_model() if not zero.pop("fresh_init", False) else _scrambled()
    engine, *_ = deepspeed.initialize(model=model, model_parameters=param_groups(model),
                                      config=ds_config(stage, GAS, **zero))
    return engine


def _scrambled():
    model = make_model()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p))
    return model


def _save(stage, save_dir, zero):
    from deepspeed.checkpoint import load_file

    engine = _engine(stage, **zero)
    train(engine, 2, GAS)
    engine.save_checkpoint(save_dir)
    own = load_file(os.path.join(save_dir, "global_step2",
                                 f"zero_pp_rank_{engine.optimizer.rank}_mp_rank_00_optim_states.pt"))
    return sorted(os.listdir(os.path.join(save_dir, "global_step2"))), own[
        "optimizer_state_dict"]["partition_count"]


def _resume(stage, save_dir, zero):
    engine = _engine(stage, fresh_init=True, **zero)
    path, _ = engine.load_checkpoint(save_dir)
    assert engine.global_steps == 2
    return train(engine, 2, GAS, first_step=2)


def _resume_error(stage, save_dir, zero):
    engine = _engine(stage, **zero)
    try:
        engine.load_checkpoint(save_dir)
    except RuntimeError as err:
        return str(err)
    return None


def _assert_matches(results, expected):
    for params in results:
        for name, want in expected.items():
            torch.testing.assert_close(params[name], want, rtol=0, atol=1e-6, msg=name)


@pytest.mark.parametrize("stage,from_fp32", [(1, True), (2, True), (2, False), (3, True)])
def test_resume_on_the_same_ranks_continues_exactly(dist_pool, tmp_path, stage, from_fp32):
    zero3 = {"stage3_param_persistence_threshold": 0} if stage == 3 else {}
    files, count = dist_pool.run(_save, args=(stage, str(tmp_path), zero3))[0]
    assert count == 2
    assert {"mp_rank_00_model_states.pt", "zero_pp_rank_0_mp_rank_00_optim_states.pt",
            "zero_pp_rank_1_mp_rank_00_optim_states.pt"} <= set(files)
    # fp32 training: the module's weights are the masters, so re-deriving them is exact too
    zero = dict(zero3, load_from_fp32_weights=from_fp32)
    results = dist_pool.run(_resume, args=(stage, str(tmp_path), zero))
    _assert_matches(results, reference_phases([(2, 2), (2, 2)], GAS))


def test_nvme_offload_checkpoint_round_trip(dist_pool, tmp_path):
    (tmp_path / "swap").mkdir()
    zero = {"offload_optimizer": {"device": "nvme", "nvme_path": str(tmp_path / "swap")},
            "sub_group_size": 50}
    dist_pool.run(_save, args=(2, str(tmp_path / "ckpt"), zero))
    results = dist_pool.run(_resume, args=(2, str(tmp_path / "ckpt"), zero))
    _assert_matches(results, reference_phases([(2, 2), (2, 2)], GAS))


def test_another_world_size_needs_elastic_checkpoint(dist_pool, tmp_path):
    dist_pool.run(_save, world_size=2, args=(2, str(tmp_path), {}))
    for message in dist_pool.run(_resume_error, world_size=3, args=(2, str(tmp_path), {})):
        assert message and "2 data-parallel ranks" in message and "has 3" in message
        assert "elastic_checkpoint" in message


@pytest.mark.parametrize("save_world,save_stage,load_world,load_stage",
                         [(2, 2, 3, 2), (3, 2, 2, 1), (2, 3, 3, 3), (3, 1, 2, 3)])
def test_elastic_checkpoint_repartitions_without_loss(dist_pool, tmp_path, save_world,
                                                      save_stage, load_world, load_stage):
    zero3 = {"stage3_param_persistence_threshold": 0}
    dist_pool.run(_save, world_size=save_world,
                  args=(save_stage, str(tmp_path), zero3 if save_stage == 3 else {}))
    zero = {"elastic_checkpoint": True, "reduce_bucket_size": 50}  # a new layout as well
    if load_stage == 3:
        zero.update(zero3)
    results = dist_pool.run(_resume, world_size=load_world,
                            args=(load_stage, str(tmp_path), zero))
    _assert_matches(results, reference_phases([(2, save_world), (2, load_world)], GAS))


def test_changed_bucket_size_on_the_same_ranks_is_re_cut(dist_pool, tmp_path):
    dist_pool.run(_save, args=(2, str(tmp_path), {}))
    results = dist_pool.run(_resume, args=(2, str(tmp_path), {"reduce_bucket_size": 11}))
    _assert_matches(results, reference_phases([(2, 2), (2, 2)], GAS))


def _save_and_list(save_dir):
    engine = _engine(2)
    train(engine, 2, GAS)
    engine.save_checkpoint(save_dir)
    return sorted(os.listdir(save_dir))


def test_zero_to_fp32_script_is_placed_next_to_latest(dist_pool, tmp_path):
    listing = dist_pool.run(_save_and_list, args=(str(tmp_path),))[0]
    assert listing == ["global_step2", "latest", "zero_to_fp32.py"]
    assert os.access(tmp_path / "zero_to_fp32.py", os.X_OK)


def _save_with_failing_script_copy(save_dir):
    """Rank 0 cannot write zero_to_fp32.py during the second save."""
    from unittest import mock

    from deepspeed import comm as dist
    from deepspeed.checkpoint import CheckpointWriteError

    engine = _engine(2)
    train(engine, 2, GAS)
    engine.save_checkpoint(save_dir)
    train(engine, 1, GAS, first_step=2)

    def refuse(path, write):
        raise OSError(f"disk full writing {path}")

    with mock.patch("deepspeed.zero.checkpointing.write_file_atomically", refuse):
        try:
            engine.save_checkpoint(save_dir)
        except (OSError, CheckpointWriteError) as err:
            failure = type(err).__name__, str(err)
        else:
            failure = None
    return dist.get_rank(), failure, open(os.path.join(save_dir, "latest")).read()


def test_a_failed_script_copy_fails_the_save_on_every_rank_before_latest(dist_pool, tmp_path):
    results = dist_pool.run(_save_with_failing_script_copy, args=(str(tmp_path),))
    for rank, failure, latest in results:
        assert failure is not None, f"rank {rank} saw the save succeed"
        assert "zero_to_fp32.py" in failure[1] or "rank(s) [0]" in failure[1], failure
        assert latest == "global_step2"  # 'latest' still names the previous checkpoint
