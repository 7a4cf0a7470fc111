"""The ``zero_optimization`` keys that choose how gradients and updated weights move (ZeRO-2 on
2 gloo ranks): each changes the collectives issued (seen by a comm observer) or what backward
keeps alive, and none changes the math (equal to the default run, bit for bit)."""
import pytest
import torch

from zero_models import ds_config, make_model, param_groups, train

STEPS, GAS = 2, 1


def _run(zero):
    import deepspeed
    from deepspeed import comm as dist

    model = make_model()
    engine, optimizer, _, _ = deepspeed.initialize(
        model=model, model_parameters=param_groups(model), config=ds_config(2, GAS, **zero))
    records = []
    alive = []  # full gradients still held after each gradient hook ran
    reducer = optimizer.reducer
    ready = reducer._grad_ready

    def watched(param):
        ready(param)
        alive.append(sum(p.grad is not None for p in engine.module.parameters()))

    for handle in reducer._handles:
        handle.remove()
    reducer._handles = [p.register_post_accumulate_grad_hook(watched)
                        for bucket in reducer.buckets for p in bucket.params]
    dist.add_comm_observer(records.append)
    try:
        params = train(engine, STEPS, GAS)
    finally:
        dist.remove_comm_observer(records.append)
    engine.destroy()
    ops = {}
    for record in records:
        ops.setdefault(record.op, []).append(record.async_op)
    return params, {op: (len(flags), any(flags)) for op, flags in ops.items()}, max(alive)


@pytest.fixture(scope="module")
def default_run(dist_pool):
    return dist_pool.run(_run, world_size=2, args=({},))


def _same_math(results, default):
    for (params, _, _), (want, _, _) in zip(results, default):
        for name, value in want.items():
            assert torch.equal(params[name], value), name


def test_contiguous_gradients_off_keeps_full_gradients_until_the_bucket_goes(dist_pool,
                                                                           default_run):
    kept = dist_pool.run(_run, world_size=2, args=({"contiguous_gradients": False},))
    assert {alive for _, _, alive in default_run} == {0}  # copied and freed as produced
    assert all(alive >= 2 for _, _, alive in kept)  # waiting in param.grad for their bucket
    _same_math(kept, default_run)


def test_reduce_scatter_and_multi_rank_allreduce_choose_the_gradient_collective(dist_pool,
                                                                              default_run):
    allreduce = dist_pool.run(_run, world_size=2, args=({"reduce_scatter": False},))
    reduces = dist_pool.run(_run, world_size=2, args=(
        {"reduce_scatter": False, "use_multi_rank_bucket_allreduce": False},))
    for (_, ops, _), (_, all_ops, _), (_, reduce_ops, _) in zip(default_run, allreduce, reduces):
        assert "reduce_scatter_tensor" in ops or "reduce_scatter" in ops, ops
        assert "all_reduce" in all_ops and "reduce" not in all_ops, all_ops
        assert "reduce" in reduce_ops, reduce_ops
    _same_math(allreduce, default_run)
    _same_math(reduces, default_run)


def test_allgather_and_bucket_keys_shape_the_collectives(dist_pool, default_run):
    broadcast = dist_pool.run(_run, world_size=2, args=({"allgather_partitions": False},))
    small = dist_pool.run(_run, world_size=2, args=({"reduce_bucket_size": 16},))
    pieces = dist_pool.run(_run, world_size=2, args=({"allgather_bucket_size": 16},))
    for (_, ops, _), (_, cast_ops, _), (_, small_ops, _), (_, piece_ops, _) in zip(
            default_run, broadcast, small, pieces):
        gathers = ops.get("all_gather_into_tensor", (0, False))[0]
        assert gathers and "broadcast" not in ops
        assert "broadcast" in cast_ops and "all_gather_into_tensor" not in cast_ops
        scatter = next(op for op in ops if op.startswith("reduce_scatter"))
        assert small_ops[scatter][0] > ops[scatter][0]  # more, smaller buckets
        # the same buckets, each gathered in pieces of at most allgather_bucket_size
        assert piece_ops[scatter][0] == ops[scatter][0]
        assert piece_ops["all_gather_into_tensor"][0] > gathers
    for run in (broadcast, small, pieces):
        _same_math(run, default_run)


def test_overlap_comm_makes_the_gradient_collectives_asynchronous(dist_pool, default_run):
    overlapped = dist_pool.run(_run, world_size=2, args=({"overlap_comm": True},))
    for (_, ops, _), (_, async_ops, _) in zip(default_run, overlapped):
        scatter = next(op for op in ops if op.startswith("reduce_scatter"))
        assert ops[scatter][1] is False and async_ops[scatter][1] is True
    _same_math(overlapped, default_run)
