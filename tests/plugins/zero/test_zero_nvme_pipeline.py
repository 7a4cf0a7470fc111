"""NVMe optimizer offload pipelining on one gloo rank: with ``pipeline_read`` the next
sub-group's read is queued before this one steps, with ``pipeline_write`` the previous one's
write is still running while this one steps; without them neither; training is the same."""
import torch

from zero_models import ds_config, make_model, param_groups, train

STEPS = 2


def _nvme_engine(path, **offload):
    """ZeRO-2 with its optimizer state swapped to ``path`` in sub-groups of 16 elements."""
    import deepspeed

    model = make_model()
    offload = {"device": "nvme", "nvme_path": path, **offload}
    engine, zero, _, _ = deepspeed.initialize(
        model=model, model_parameters=param_groups(model),
        config=ds_config(2, 1, offload_optimizer=offload, sub_group_size=16))
    return engine, zero


def _on_one_rank(dist_pool, folder, run, *args):
    """``run(str(folder), *args)`` on one gloo rank, ``folder`` created for its swap files."""
    folder.mkdir()
    [result] = dist_pool.run(run, world_size=1, args=(str(folder), *args))
    return result


def _run(path, read, write):
    engine, zero = _nvme_engine(path, pipeline_read=read, pipeline_write=write)
    swapper, basic = zero.swapper, zero.optimizer
    seen = {"writes_while_stepping": [], "reads_queued_while_stepping": []}
    step = basic.step

    def observed_step(*args, **kwargs):  # one sub-group at a time
        seen["writes_while_stepping"].append(swapper.writes_in_flight())
        seen["reads_queued_while_stepping"].append(swapper.reads_in_flight())
        return step(*args, **kwargs)

    basic.step = observed_step
    params = train(engine, STEPS, 1)
    groups = len(zero.all_chunks)
    engine.destroy()
    return params, seen, groups


def test_pipeline_read_and_write_overlap_io_with_the_step(dist_pool, tmp_path):
    plain, quiet, groups = _on_one_rank(dist_pool, tmp_path / "plain", _run, False, False)
    piped, busy, _ = _on_one_rank(dist_pool, tmp_path / "piped", _run, True, True)
    assert groups >= 3
    # without pipelining every read and write is done before the next sub-group steps
    assert set(quiet["writes_while_stepping"]) == {0}
    assert set(quiet["reads_queued_while_stepping"]) == {0}
    # pipeline_read: every sub-group but the last of a step has the next one's read queued
    assert sum(1 for n in busy["reads_queued_while_stepping"] if n) == STEPS * (groups - 1)
    # pipeline_write: the previous sub-group's write is still in flight (or just done)
    assert any(busy["writes_while_stepping"])
    for name, value in plain.items():
        assert torch.equal(piped[name], value), name


def _initial_writes(path, fast_init):
    engine, zero = _nvme_engine(path, fast_init=fast_init, buffer_count=4)
    joins, groups = zero.swapper.joins, len(zero.offloaded_chunks)
    params = train(engine, 1, 1)
    engine.destroy()
    return joins, groups, params


def test_fast_init_queues_the_initial_writes_together(dist_pool, tmp_path):
    slow_joins, groups, slow = _on_one_rank(dist_pool, tmp_path / "slow", _initial_writes, False)
    fast_joins, _, fast = _on_one_rank(dist_pool, tmp_path / "fast", _initial_writes, True)
    assert groups >= 5
    assert slow_joins == groups  # each sub-group's first write waited for alone
    assert fast_joins == -(-groups // 4)  # buffer_count writes in flight per wait
    for name, value in slow.items():
        assert torch.equal(fast[name], value), name
