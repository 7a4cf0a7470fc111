"""MoE checkpoints: every expert in its own file, so a checkpoint saved with 2 ranks (ep 2)
loads on 1 rank (ep 1) and on 4 ranks (ep 4, ep 2) and gives the same outputs; at the same
layout the optimizer state (SGD momentum, per expert-parallel rank) comes back too, and
training resumes with bit-identical losses."""
import os

import pytest
import torch

from moe_helpers import TinyMoEModel, ep_model, global_expert_name, loss_of, moe_param_groups

MICRO, LR, IN, OUT, NUM_EXPERTS = 6, 0.1, 4, 3, 4
EXPERT_FILES = [f"layer_0_expert_{e}_mp_rank_00_model_states.pt" for e in range(NUM_EXPERTS)]


def _data(world, steps, seed):
    g = torch.Generator().manual_seed(seed)
    return [[(torch.randn(MICRO, IN, generator=g), torch.randn(MICRO, OUT, generator=g))
             for _ in range(world)] for _ in range(steps)]


def _probe():
    return torch.randn(MICRO, IN, generator=torch.Generator().manual_seed(99))


def _engine(ep_size, seed, extra=None):
    """An engine whose weights are those of the ep-1 reference built after ``manual_seed(seed)``
    (so different seeds give different weights, whatever the layout)."""
    import deepspeed

    model, _ = ep_model(ep_size, seed, num_experts=NUM_EXPERTS)
    config = {"train_micro_batch_size_per_gpu": MICRO, "steps_per_print": 10 ** 6,
              "optimizer": {"type": "SGD", "params": {"lr": LR, "momentum": 0.9}},
              **(extra or {})}
    engine, *_ = deepspeed.initialize(model=model, config=config,
                                      model_parameters=moe_param_groups(model))
    return engine


def _train(engine, data):
    import deepspeed.comm as dist

    rank, losses = dist.get_rank(), []
    for step in data:
        x, y = step[rank]
        loss = loss_of(engine, x, y)
        engine.backward(loss)
        engine.step()
        losses.append(loss.item())
    return losses


def _outputs(engine):
    with torch.no_grad():
        return engine(_probe())[0].clone()


def _global_params(engine):
    """This rank's parameters under the ep-1 model's names (global expert ids)."""
    layer = engine.module.moe
    first = (_ep_rank(layer) if layer.ep_size > 1 else 0) * layer.num_local_experts
    return {global_expert_name(name, first): value.detach().clone()
            for name, value in engine.module.named_parameters()}


def _ep_rank(layer):
    from deepspeed.utils import groups

    return groups._get_expert_parallel_rank(layer.expert_group_name)


def _save_then_continue(save_dir, ep_size, extra=None):
    import deepspeed.comm as dist

    world = dist.get_world_size()
    engine = _engine(ep_size, seed=0, extra=extra)
    _train(engine, _data(world, 2, seed=1))
    engine.save_checkpoint(save_dir, tag="ckpt")
    outputs, params = _outputs(engine), _global_params(engine)
    after = _train(engine, _data(world, 3, seed=2))
    engine.destroy()
    return outputs, after, params


def _load(save_dir, ep_size, load_optimizer_states, seed=7, extra=None):
    engine = _engine(ep_size, seed=seed, extra=extra)
    path, client = engine.load_checkpoint(save_dir, load_optimizer_states=load_optimizer_states)
    return engine


def _load_outputs(save_dir, ep_size):
    engine = _load(save_dir, ep_size, load_optimizer_states=False)
    outputs, params = _outputs(engine), _global_params(engine)
    steps = engine.global_steps
    engine.destroy()
    return outputs, steps, params


def _resume(save_dir, ep_size, load_optimizer_states, extra=None):
    import deepspeed.comm as dist

    engine = _load(save_dir, ep_size, load_optimizer_states, extra=extra)
    losses = _train(engine, _data(dist.get_world_size(), 3, seed=2))
    engine.destroy()
    return losses


def _refused_optimizer(save_dir, ep_size):
    engine = _engine(ep_size, seed=7)
    try:
        engine.load_checkpoint(save_dir)
    except ValueError as exc:
        return str(exc)
    finally:
        engine.destroy()
    return None


@pytest.fixture(scope="module")
def saved_ep2(dist_pool, tmp_path_factory):
    """Trained 2 steps on 2 ranks with ep 2, saved, then 3 more steps."""
    save_dir = str(tmp_path_factory.mktemp("moe_ckpt_ep2"))
    results = dist_pool.run(_save_then_continue, world_size=2, args=(save_dir, 2))
    return save_dir, results


def test_expert_files_model_states_without_experts_and_per_rank_optimizer_files(saved_ep2):
    from deepspeed.checkpoint import load_file

    save_dir, _ = saved_ep2
    ckpt = os.path.join(save_dir, "ckpt")
    names = sorted(os.listdir(ckpt))
    for name in EXPERT_FILES + ["expp_rank_0_mp_rank_00_optim_states.pt",
                                "expp_rank_1_mp_rank_00_optim_states.pt",
                                "mp_rank_00_model_states.pt"]:
        assert name in names
    state = load_file(os.path.join(ckpt, "mp_rank_00_model_states.pt"))
    assert not [k for k in state["module"] if "deepspeed_experts" in k]
    assert "moe.deepspeed_moe.gate.wg.weight" in state["module"]
    assert state["optimizer"] is None  # per expert-parallel rank, in the expp_rank files
    # with each global rank's rank in its expert-parallel and expert-data-parallel group
    assert state["moe_checkpoint"]["layers"] == [
        {"name": "moe", "num_experts": 4, "ep_size": 2, "expert_parallel_ranks": [0, 1],
         "expert_data_parallel_ranks": [0, 0]}]
    expert3 = load_file(os.path.join(ckpt, EXPERT_FILES[3]))
    assert sorted(expert3) == sorted(f"moe.deepspeed_moe.experts.deepspeed_experts.3.{k}"
                                     for k in ("0.weight", "0.bias", "2.weight", "2.bias"))


def _saved_params(saved):
    """Every parameter of the saved model (each rank contributes its own experts)."""
    merged = {}
    for *_, params in saved:
        for name, value in params.items():
            if name in merged:
                assert torch.equal(merged[name], value)  # replicas agree
            merged[name] = value
    assert len([n for n in merged if n.endswith("deepspeed_experts.3.0.weight")]) == 1
    return merged


# Layouts on 4 ranks are tested at the end of the file: the pool keeps two world sizes warm,
# and a 4-rank case between the 1- and 2-rank ones restarted a pool (~3 CPU s a rank) per test.
@pytest.mark.parametrize("world,ep_size", [(2, 2), (1, 1)])
def test_saved_on_two_ranks_ep2_loads_on_another_layout_with_the_same_outputs(
        dist_pool, saved_ep2, world, ep_size):
    """The weights and the outputs come back bit for bit at every layout: each expert runs on
    one source rank's slots at a time, so no layout changes the shape of its products."""
    _check_the_same_outputs(dist_pool, saved_ep2, world, ep_size)


def _check_the_same_outputs(dist_pool, saved_ep2, world, ep_size):
    save_dir, saved = saved_ep2
    expected, weights = saved[0][0], _saved_params(saved)
    assert torch.equal(saved[1][0], expected)  # every rank fed the same probe
    for outputs, steps, params in dist_pool.run(_load_outputs, world_size=world,
                                                args=(save_dir, ep_size)):
        assert steps == 2
        for name, value in params.items():
            assert torch.equal(value, weights[name]), name
        assert torch.equal(outputs, expected), (outputs - expected).abs().max()


def test_resume_at_the_same_layout_continues_with_bit_identical_losses(dist_pool, saved_ep2):
    save_dir, saved = saved_ep2
    resumed = dist_pool.run(_resume, world_size=2, args=(save_dir, 2, True))
    assert resumed == [after for _, after, _ in saved]
    # the momentum buffers matter: without them the losses after the first step differ
    fresh = dist_pool.run(_resume, world_size=2, args=(save_dir, 2, False))
    assert [f[0] for f in fresh] == [after[0] for _, after, _ in saved]
    assert fresh != resumed


@pytest.mark.parametrize("world,ep_size", [(1, 1)])
def test_optimizer_state_of_another_layout_is_refused_naming_both(
        dist_pool, saved_ep2, world, ep_size):
    _check_refused_naming_both(dist_pool, saved_ep2, world, ep_size)


def _check_refused_naming_both(dist_pool, saved_ep2, world, ep_size):
    save_dir, _ = saved_ep2
    for message in dist_pool.run(_refused_optimizer, world_size=world, args=(save_dir, ep_size)):
        assert message is not None
        assert "saved with ep_size=2, world size 2" in message
        assert f"this engine has ep_size={ep_size}, world size {world}" in message
        assert "load_optimizer_states=False" in message


def test_ep1_moe_checkpoint_loads_with_experts_split(dist_pool, tmp_path):
    """The other direction: an ep-1 save (one rank) loads on 2 ranks with ep 2."""
    save_dir = str(tmp_path)
    saved = dist_pool.run(_save_then_continue, world_size=1, args=(save_dir, 1))
    assert "optim_states" not in " ".join(os.listdir(tmp_path / "ckpt"))  # the core's own file
    weights = _saved_params(saved)
    for loaded, steps, params in dist_pool.run(_load_outputs, world_size=2, args=(save_dir, 2)):
        assert steps == 2
        for name, value in params.items():
            assert torch.equal(value, weights[name]), name
        assert torch.equal(loaded, saved[0][0]), (loaded - saved[0][0]).abs().max()


ZERO2 = {"zero_optimization": {"stage": 2}, "zero_allow_untested_optimizer": True}


def test_zero2_ep2_resumes_from_its_own_shards_and_the_expert_files(dist_pool, tmp_path):
    """With ZeRO the optimizer state is ZeRO's per-rank shards (no expp_rank files); the
    experts still go to their own files and load at ep 1 on one rank."""
    from deepspeed.checkpoint import load_file

    save_dir = str(tmp_path)
    saved = dist_pool.run(_save_then_continue, world_size=2, args=(save_dir, 2, ZERO2))
    names = os.listdir(tmp_path / "ckpt")
    assert not [n for n in names if n.startswith("expp_rank_")]
    assert all(name in names for name in EXPERT_FILES)
    state = load_file(str(tmp_path / "ckpt" / "mp_rank_00_model_states.pt"))
    assert not [k for k in state["module"] if "deepspeed_experts" in k]
    resumed = dist_pool.run(_resume, world_size=2, args=(save_dir, 2, True, ZERO2))
    assert resumed == [after for _, after, _ in saved]
    weights = _saved_params(saved)
    for loaded, steps, params in dist_pool.run(_load_outputs, world_size=1, args=(save_dir, 1)):
        for name, value in params.items():
            assert torch.equal(value, weights[name]), name
        assert torch.equal(loaded, saved[0][0]), (loaded - saved[0][0]).abs().max()


def _reference_keys():
    torch.manual_seed(0)
    return list(TinyMoEModel(ep_size=1, num_experts=NUM_EXPERTS).state_dict())


def _check_consolidated(state_dict, saved):
    assert list(state_dict) == _reference_keys()  # the ep-1 model's names, in its order
    weights = _saved_params(saved)
    for name, value in state_dict.items():
        assert torch.equal(value, weights[name]), name


def test_zero_to_fp32_merges_the_expert_files_of_a_checkpoint_without_zero(saved_ep2):
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    save_dir, saved = saved_ep2
    _check_consolidated(get_fp32_state_dict_from_zero_checkpoint(save_dir, tag="ckpt"), saved)
    lazy = get_fp32_state_dict_from_zero_checkpoint(save_dir, tag="ckpt", lazy_mode=True)
    _check_consolidated({k: v.contiguous() for k, v in lazy.items()}, saved)


def test_zero_to_fp32_of_a_zero2_ep2_checkpoint_takes_split_experts_from_their_files(
        dist_pool, tmp_path):
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    saved = dist_pool.run(_save_then_continue, world_size=2, args=(str(tmp_path), 2, ZERO2))
    _check_consolidated(get_fp32_state_dict_from_zero_checkpoint(str(tmp_path), tag="ckpt"),
                        saved)


# ---------------------------------------------------------------------- four ranks, last
@pytest.mark.parametrize("world,ep_size", [(4, 4), (4, 2)])
def test_saved_on_two_ranks_ep2_loads_on_four_ranks_with_the_same_outputs(
        dist_pool, saved_ep2, world, ep_size):
    _check_the_same_outputs(dist_pool, saved_ep2, world, ep_size)


@pytest.mark.parametrize("world,ep_size", [(4, 4)])
def test_optimizer_state_of_another_layout_on_four_ranks_is_refused_naming_both(
        dist_pool, saved_ep2, world, ep_size):
    _check_refused_naming_both(dist_pool, saved_ep2, world, ep_size)


def _save_resume_four_ranks(save_dir):
    import deepspeed.comm as dist

    engine = _engine(2, seed=0)
    _train(engine, _data(4, 2, seed=1))
    engine.save_checkpoint(save_dir, tag="ckpt")
    after = _train(engine, _data(4, 3, seed=2))
    engine.destroy()
    dist.barrier()
    return after, _resume(save_dir, 2, True)


def test_four_ranks_ep2_resume_restores_each_expert_group_state(dist_pool, tmp_path):
    results = dist_pool.run(_save_resume_four_ranks, world_size=4, args=(str(tmp_path),))
    for after, resumed in results:
        assert resumed == after
    names = os.listdir(tmp_path / "ckpt")
    assert sorted(n for n in names if n.startswith("expp_rank_")) == [
        "expp_rank_0_mp_rank_00_optim_states.pt", "expp_rank_1_mp_rank_00_optim_states.pt"]
    assert all(name in names for name in EXPERT_FILES)
