"""MiCS (``mics_shard_size``) on 2 and 4 gloo ranks: shard size = world is ZeRO-3 bit for bit,
shard size 1 is data parallelism, shard size 2 of 4 ranks trains like the single-process
reference while every all-gather stays inside a shard group; checkpoints move between shard
sizes; ``MiCS_Init``; the hierarchical two-hop gather; the refused combinations."""
import os
import re
import sys

import pytest
import torch

from deepspeed.testing.distributed import run_distributed
from rank_errors import error_of
from zero_models import (ds_config, make_model, param_groups, reference, reference_phases,
                         train)

EXAMPLES = os.path.join(os.path.dirname(__file__), "..", "..", "..", "examples")


class Records:
    """Every deepspeed.comm op of this rank while active: (op, group ranks, bytes)."""

    def __enter__(self):
        from deepspeed import comm as dist

        self.ops = []
        self._fn = lambda r: self.ops.append((r.op, tuple(r.group_ranks or ()), r.size_bytes))
        dist.add_comm_observer(self._fn)
        return self

    def __exit__(self, *exc):
        from deepspeed import comm as dist

        dist.remove_comm_observer(self._fn)


def _engine(stage=3, gas=1, model=None, **zero):
    import deepspeed

    model = model if model is not None else make_model()
    engine, *_ = deepspeed.initialize(model=model, model_parameters=param_groups(model),
                                      config=ds_config(stage, gas, **zero))
    return engine


def _run(stage=3, gas=1, steps=3, **zero):
    engine = _engine(stage, gas, **zero)
    params = train(engine, steps, gas)
    shards = {n: (p.ds_tensor.numel(), p.ds_numel) for n, p in engine.module.named_parameters()
              if hasattr(p, "ds_id")}
    engine.destroy()
    return params, shards


def _same_as_zero3(gas):
    world = torch.distributed.get_world_size()
    plain, _ = _run(gas=gas)
    mics, _ = _run(gas=gas, mics_shard_size=world)
    return all(torch.equal(plain[n], mics[n]) for n in plain)


@pytest.mark.parametrize("world", [2, 4])
def test_shard_size_equal_to_world_is_zero3_bit_for_bit(world):
    assert run_distributed(_same_as_zero3, world_size=world, args=(2,)) == [True] * world


def _data_parallel_and_mics_one():
    dp, _ = _run(stage=0, steps=3)
    mics, shards = _run(mics_shard_size=1, steps=3)
    return dp, mics, shards


def test_shard_size_one_is_data_parallelism():
    want = reference(3, 1, 2)
    for dp, mics, shards in run_distributed(_data_parallel_and_mics_one, world_size=2):
        assert all(held == numel for held, numel in shards.values()), shards  # whole params
        for name in want:
            torch.testing.assert_close(mics[name], dp[name], rtol=1e-6, atol=1e-7)
            torch.testing.assert_close(mics[name], want[name], rtol=1e-5, atol=1e-6)


def _mics_two_of_four(zero):
    from deepspeed import comm as dist

    with Records() as records:
        params, shards = _run(gas=2, **zero)
    rank = dist.get_rank()
    shard_group = (0, 1) if rank < 2 else (2, 3)
    replica_group = (rank % 2, rank % 2 + 2)
    kinds = {}
    for op, group, _ in records.ops:
        kinds.setdefault(op, set()).add(group)
    return params, shards, kinds, shard_group, replica_group


@pytest.mark.parametrize("zero", [{}, {"overlap_comm": False, "reduce_scatter": False},
                                  {"offload_optimizer": {"device": "cpu"}}],
                         ids=["default", "no-overlap-allreduce", "offload-optimizer"])
def test_two_shards_of_four_ranks_train_like_the_reference(zero):
    """Gradient accumulation (2 micro-batches) and clipping included (``ds_config``)."""
    want = reference(3, 2, 4)
    results = run_distributed(_mics_two_of_four, world_size=4,
                              args=(dict(zero, mics_shard_size=2),))
    for params, shards, kinds, shard_group, replica_group in results:
        for name in want:
            torch.testing.assert_close(params[name], want[name], rtol=1e-5, atol=1e-6)
        assert all(held == -(-numel // 2) for held, numel in shards.values()), shards
        # parameters are gathered only inside the shard group ...
        assert kinds["all_gather_into_tensor"] == {shard_group}, kinds
        # ... gradients are reduced there and summed across the replicas
        reduce = "reduce_scatter_tensor" if "reduce_scatter_tensor" in kinds else None
        if reduce:
            assert kinds[reduce] == {shard_group}, kinds
        assert replica_group in kinds["all_reduce"], kinds
    assert results[0][0] == results[0][0] and all(
        torch.equal(results[0][0][n], r[0][n]) for r in results for n in want)


def _gpt_losses(zero, steps=20):
    import deepspeed
    from deepspeed import comm as dist

    sys.path.insert(0, EXAMPLES)
    from gpt import GPT, GPTConfig, MarkovTokens

    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=32, block_size=16, n_layer=2, n_head=2, n_embd=32))
    config = {"train_micro_batch_size_per_gpu": 2, "gradient_clipping": 1.0,
              "optimizer": {"type": "AdamW", "params": {"lr": 1e-2}},
              "zero_optimization": dict({"stage": 3, "stage3_param_persistence_threshold": 0},
                                        **zero)}
    engine, *_ = deepspeed.initialize(model=model, config=config)
    rank, world = dist.get_rank(), dist.get_world_size()
    data = MarkovTokens(samples=2 * world, seq_len=16)
    losses = []
    for step in range(steps):  # one global batch, again and again: the loss must fall
        index = rank * 2
        x, y = zip(*(data[index + i] for i in range(2)))
        loss = engine(torch.stack(x), torch.stack(y))
        engine.backward(loss)
        engine.step()
        mean = loss.detach().clone()
        dist.all_reduce(mean)
        losses.append(float(mean) / world)
    engine.destroy()
    return losses


def _gpt_pair():
    return _gpt_losses({}), _gpt_losses({"mics_shard_size": 2})


def test_tiny_gpt_losses_follow_zero3_for_twenty_steps():
    """MiCS sums gradients in another order (shard group, then replicas) than ZeRO-3's one
    reduce-scatter, so the losses agree to float rounding, not bit for bit."""
    zero3, mics = run_distributed(_gpt_pair, world_size=4, timeout=240)[0]
    assert len(mics) == 20 and mics[-1] < mics[0] - 1.0  # it learns (memorises the batch)
    for a, b in zip(zero3, mics):
        assert abs(a - b) <= 1e-4 * abs(a), (zero3, mics)


# ---------------------------------------------------------------------- checkpoints
def _save_and_resume(save_dir, save_zero, load_zero):
    """Train 2 steps under ``save_zero`` and save; a fresh engine under ``load_zero`` loads
    and trains 2 more. Returns the final parameters."""
    first = _engine(gas=1, **save_zero)
    train(first, 2, 1)
    first.save_checkpoint(save_dir, tag="t")
    first.destroy()
    second = _engine(gas=1, **load_zero)
    second.load_checkpoint(save_dir, tag="t")
    params = train(second, 2, 1, first_step=2)
    second.destroy()
    return params


@pytest.mark.parametrize("save_size,load_size", [(2, 4), (4, 2), (2, 1), (-1, 2)])
def test_checkpoints_move_between_shard_sizes(tmp_path, save_size, load_size):
    """A checkpoint saved with one ``mics_shard_size`` (-1: plain ZeRO-3) continues under
    another exactly like an uninterrupted run (the single-process reference)."""
    want = reference_phases([(2, 4), (2, 4)], 1)
    results = run_distributed(_save_and_resume, world_size=4,
                              args=(str(tmp_path), {"mics_shard_size": save_size},
                                    {"mics_shard_size": load_size}))
    for params in results:
        for name in want:
            torch.testing.assert_close(params[name], want[name], rtol=1e-5, atol=1e-6)


def _consolidate(save_dir):
    from deepspeed import comm as dist
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    engine = _engine(mics_shard_size=2)
    params = train(engine, 2, 1)
    engine.save_checkpoint(save_dir, tag="t")
    engine.destroy()
    dist.barrier()
    state = get_fp32_state_dict_from_zero_checkpoint(save_dir, tag="t")
    return all(torch.equal(state[n].float(), params[n]) for n in params
               if n in state), sorted(state) == sorted(params)


def test_zero_to_fp32_reads_a_mics_checkpoint(tmp_path):
    assert run_distributed(_consolidate, world_size=4, args=(str(tmp_path),)) == \
        [(True, True)] * 4


# ---------------------------------------------------------------------- MiCS_Init
def _built_under_mics_init():
    import deepspeed

    config = ds_config(3, 1, mics_shard_size=2)
    with deepspeed.zero.MiCS_Init(config_dict_or_path=config, dtype=torch.float32):
        model = make_model()
    shards = {n: (p.ds_tensor.numel(), p.ds_numel) for n, p in model.named_parameters()}
    engine, *_ = deepspeed.initialize(model=model, model_parameters=param_groups(model),
                                      config=config)
    params = train(engine, 3, 1)
    engine.destroy()
    return shards, params


def test_mics_init_partitions_in_shard_groups_and_trains():
    want = reference(3, 1, 4)
    for shards, params in run_distributed(_built_under_mics_init, world_size=4):
        assert all(held == -(-numel // 2) for held, numel in shards.values()), shards
        for name in want:
            torch.testing.assert_close(params[name], want[name], rtol=1e-5, atol=1e-6)


def _init_mismatch(built_by_mics_init):
    """The refusal's message on each rank (``error_of``: the 4-rank pool stays warm)."""
    import deepspeed

    if built_by_mics_init:  # shard size 2, and the engine's config asks for none
        with deepspeed.zero.MiCS_Init(config_dict_or_path=ds_config(3, 1, mics_shard_size=2),
                                      dtype=torch.float32):
            model = make_model()
        return error_of(_engine, 3, 1, model)
    with deepspeed.zero.Init(config_dict_or_path=ds_config(3, 1), dtype=torch.float32):
        model = make_model()
    return error_of(_engine, 3, 1, model, mics_shard_size=2)


def _assert_every_rank_refused(messages, pattern):
    assert len(messages) == 4
    for message in messages:
        assert message is not None and re.search(pattern, message), messages


@pytest.mark.parametrize("built_by_mics_init,message", [
    (False, "partitioned by deepspeed.zero.Init over ranks \\[0, 1, 2, 3\\]"),
    (True, "partitioned by deepspeed.zero.MiCS_Init over ranks"),
])
def test_a_model_partitioned_in_other_groups_is_refused(built_by_mics_init, message):
    _assert_every_rank_refused(
        run_distributed(_init_mismatch, world_size=4, args=(built_by_mics_init,)), message)


def test_mics_init_needs_a_config_with_a_shard_size():
    from deepspeed.zero import MiCS_Init

    with pytest.raises(ValueError, match="config_dict_or_path"):
        MiCS_Init()
    with pytest.raises(ValueError, match="mics_shard_size"):
        MiCS_Init(config_dict_or_path={"zero_optimization": {"stage": 3}})


# ---------------------------------------------------------------------- hierarchical gather
def _hierarchical():
    """4 ranks as 2 nodes x 2 (LOCAL_WORLD_SIZE=2), one shard group over both nodes."""
    flat, _ = _run(mics_shard_size=4)
    with Records() as records:
        two_hop, _ = _run(mics_shard_size=4, mics_hierarchical_params_gather=True)
    gathers = {group for op, group, _ in records.ops if op == "all_gather_into_tensor"}
    return all(torch.equal(flat[n], two_hop[n]) for n in flat), gathers


def test_hierarchical_gather_is_two_hops_with_the_same_result():
    results = run_distributed(_hierarchical, world_size=4, env={"LOCAL_WORLD_SIZE": "2"})
    for rank, (same, gathers) in enumerate(results):
        assert same
        node = (0, 1) if rank < 2 else (2, 3)
        assert gathers == {(rank % 2, rank % 2 + 2), node}, gathers


# ---------------------------------------------------------------------- refusals
def _refused(zero, stage=3):
    return error_of(_engine, stage, 1, None, **zero)


@pytest.mark.parametrize("zero,stage,message", [
    ({"mics_shard_size": 2}, 2, "needs ZeRO stage 3"),
    ({"mics_shard_size": 3}, 3, "must divide the data-parallel world size 4"),
    ({"mics_shard_size": 0}, 3, "positive number"),
    ({"mics_hierarchical_params_gather": True}, 3, "mics_shard_size is not"),
    ({"mics_shard_size": 2, "zero_hpz_partition_size": 2}, 3, "cannot be combined"),
    ({"mics_shard_size": 2, "offload_param": {"device": "nvme", "nvme_path": "/tmp"}}, 3,
     "nvme"),
])
def test_combinations_that_cannot_work_are_refused_at_initialize(zero, stage, message):
    _assert_every_rank_refused(run_distributed(_refused, world_size=4, args=(zero, stage)),
                               message)


def _precision_pair(section):
    import deepspeed

    out = []
    for zero in ({}, {"mics_shard_size": 2}):
        model = make_model()
        config = dict(ds_config(3, 1, **zero), **section)
        engine, *_ = deepspeed.initialize(model=model, model_parameters=param_groups(model),
                                          config=config)
        out.append(train(engine, 3, 1))
        engine.destroy()
    return out


@pytest.mark.parametrize("section", [
    {"bf16": {"enabled": True}},
    {"fp16": {"enabled": True, "initial_scale_power": 8}},
], ids=["bf16", "fp16"])
def test_16_bit_training_follows_zero3(section):
    """16-bit parameters: MiCS and ZeRO-3 round the same fp32 updates, summed in another
    order, so they agree to the 16-bit rounding."""
    for zero3, mics in run_distributed(_precision_pair, world_size=4, args=(section,)):
        for name in zero3:
            torch.testing.assert_close(mics[name], zero3[name], rtol=2e-2, atol=1e-2)
