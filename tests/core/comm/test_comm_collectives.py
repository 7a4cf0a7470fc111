"""Every deepspeed.comm collective on 2 gloo ranks, natively and through the forced fallbacks.

Each `_rank_*` function runs inside the ranks and returns plain lists; the expected values are
computed here from the rank formulas, independently of the code under test.
"""
import pytest
import torch

from deepspeed.comm import capabilities
from deepspeed.testing.distributed import run_distributed

WORLD = 2


def _x(rank, n=4):
    """The tensor rank `rank` contributes: distinct per rank and per element."""
    return torch.arange(n, dtype=torch.float32) + 10 * rank


# --------------------------------------------------------------------------- in the ranks
def _rank_queries():
    import deepspeed.comm as dist

    group = dist.new_group([0, 1])
    return {
        "rank": dist.get_rank(), "size": dist.get_world_size(), "local": dist.get_local_rank(),
        "backend": dist.get_backend(), "available": dist.is_available(),
        "initialized": dist.is_initialized(), "ranks": dist.get_all_ranks_from_group(group),
        "global_of_1": dist.get_global_rank(group, 1), "group_size": dist.get_world_size(group),
    }


def _rank_reductions():
    import deepspeed.comm as dist

    rank = dist.get_rank()
    out = {}
    for name, op in (("sum", dist.ReduceOp.SUM), ("max", dist.ReduceOp.MAX),
                     ("avg", dist.ReduceOp.AVG)):
        t = _x(rank)
        dist.all_reduce(t, op=op)
        out[name] = t.tolist()
    t = _x(rank)
    dist.inference_all_reduce(t)
    out["inference"] = t.tolist()
    t = _x(rank)
    handle = dist.all_reduce(t, async_op=True)
    handle.wait()
    out["async"] = t.tolist()
    t = _x(rank)
    dist.reduce(t, dst=0)
    out["reduce_on_dst"] = t.tolist() if rank == 0 else None
    return out


def _rank_movement():
    import deepspeed.comm as dist

    rank = dist.get_rank()
    out = {}
    t = _x(rank)
    dist.broadcast(t, src=1)
    out["broadcast"] = t.tolist()
    objects = [{"from": rank}] if rank == 1 else [None]
    dist.broadcast_object_list(objects, src=1)
    out["broadcast_object"] = objects
    parts = [torch.zeros(4) for _ in range(WORLD)]
    dist.all_gather(parts, _x(rank))
    out["all_gather"] = [p.tolist() for p in parts]
    gathered = [None] * WORLD
    dist.all_gather_object(gathered, ("rank", rank))
    out["all_gather_object"] = gathered
    gather_list = [torch.zeros(4) for _ in range(WORLD)] if rank == 0 else None
    dist.gather(_x(rank), gather_list, dst=0)
    out["gather"] = [p.tolist() for p in gather_list] if rank == 0 else None
    received = torch.zeros(4)
    dist.scatter(received, [_x(0) * 2, _x(1) * 2] if rank == 0 else None, src=0)
    out["scatter"] = received.tolist()
    return out


def _rank_point_to_point():
    import deepspeed.comm as dist

    rank, peer = dist.get_rank(), 1 - dist.get_rank()
    got = torch.zeros(4)
    if rank == 0:
        dist.send(_x(rank), dst=peer)
        sender = dist.recv(got, src=peer)
    else:
        sender = dist.recv(got, src=peer)
        dist.send(_x(rank), dst=peer)
    async_got = torch.zeros(4)
    works = [dist.irecv(async_got, src=peer), dist.isend(_x(rank) + 100, dst=peer)]
    for work in works:
        work.wait()
    dist.barrier()
    dist.monitored_barrier()
    return {"blocking": got.tolist(), "sender": sender, "async": async_got.tolist()}


def _rank_fallback_family(forced, use_subgroup):
    """The ops that have fallbacks; `forced` names the ops whose native version is refused."""
    import deepspeed.comm as dist

    with capabilities.override(**{op: False for op in forced}):
        group = dist.new_group([0, 1]) if use_subgroup else None
        rank = dist.get_rank()
        out = {}
        t = _x(rank)
        dist.all_reduce(t, op=dist.ReduceOp.AVG, group=group)
        out["avg"] = t.tolist()
        shard = torch.zeros(2)
        given = _x(rank)
        dist.reduce_scatter_tensor(shard, given, group=group)
        out["reduce_scatter_tensor"] = shard.tolist()
        out["input_kept"] = torch.equal(given, _x(rank))  # torch's promise
        scratch_shard = torch.zeros(2)
        dist.reduce_scatter_tensor(scratch_shard, _x(rank), group=group, input_is_scratch=True)
        out["reduce_scatter_tensor_scratch"] = scratch_shard.tolist()
        shard = torch.zeros(2)
        dist.reduce_scatter_fn(shard, _x(rank).view(2, 2), op=dist.ReduceOp.MAX, group=group)
        out["reduce_scatter_fn_max"] = shard.tolist()
        shard = torch.zeros(3)
        dist.reduce_scatter(shard, [_x(rank, 3), _x(rank, 3) * 2], group=group)
        out["reduce_scatter"] = shard.tolist()
        full = torch.zeros(2, 4)
        work = dist.all_gather_into_tensor(full, _x(rank), group=group, async_op=True)
        work.wait()
        out["all_gather_into_tensor"] = full.tolist()
        full = torch.zeros(8)
        dist.allgather_fn(full, _x(rank), group=group)
        out["allgather_fn"] = full.tolist()
        received = torch.zeros(4)
        dist.all_to_all_single(received, _x(rank), group=group)
        out["all_to_all_single"] = received.tolist()
        # uneven: rank r sends r+1 rows to rank 0 and 2 rows to rank 1
        send = _x(rank, rank + 3)
        in_splits = [rank + 1, 2]
        out_splits = [1, 2] if rank == 0 else [2, 2]
        received = torch.zeros(sum(out_splits))
        dist.all_to_all_single(received, send, out_splits, in_splits, group=group)
        out["all_to_all_single_uneven"] = received.tolist()
        sizes = (2, 3) if rank == 0 else (1, 1)
        outputs = [torch.zeros(n) for n in sizes]
        dist.all_to_all(outputs, _inputs_for_all_to_all(rank), group=group)
        out["all_to_all"] = [o.tolist() for o in outputs]
        outputs = [torch.zeros(2), torch.zeros(2)]
        dist.all_to_all(outputs, [_x(rank, 2), _x(rank, 2) + 50], group=group)
        out["all_to_all_even"] = [o.tolist() for o in outputs]
        dist.monitored_barrier(group=group)
        out["known"] = {op: ok for (backend, op), ok in capabilities.known().items()}
        if use_subgroup:
            dist.destroy_process_group(group)
        return out


def _inputs_for_all_to_all(rank):
    """rank r sends r+2 values to rank 0 and 1 value to rank 1."""
    return [_x(rank, rank + 2), _x(rank, 1) + 100]


# --------------------------------------------------------------------------- expectations
def _expected_fallback_family():
    x = [_x(r) for r in range(WORLD)]
    total = x[0] + x[1]
    per_rank = []
    for rank in range(WORLD):
        rs_list = [_x(0, 3) + _x(1, 3), (_x(0, 3) + _x(1, 3)) * 2][rank]
        sends = [_x(r, r + 3) for r in range(WORLD)]
        in_splits = {0: [1, 2], 1: [2, 2]}
        uneven = []
        for src in range(WORLD):
            start = sum(in_splits[src][:rank])
            uneven += sends[src][start:start + in_splits[src][rank]].tolist()
        per_rank.append({
            "avg": (total / 2).tolist(),
            "reduce_scatter_tensor": total[2 * rank:2 * rank + 2].tolist(),
            "input_kept": True,
            "reduce_scatter_tensor_scratch": total[2 * rank:2 * rank + 2].tolist(),
            "reduce_scatter_fn_max": torch.maximum(x[0], x[1])[2 * rank:2 * rank + 2].tolist(),
            "reduce_scatter": rs_list.tolist(),
            "all_gather_into_tensor": [x[0].tolist(), x[1].tolist()],
            "allgather_fn": torch.cat(x).tolist(),
            "all_to_all_single": [x[0][2 * rank:2 * rank + 2].tolist(),
                                  x[1][2 * rank:2 * rank + 2].tolist()],
            "all_to_all_single_uneven": uneven,
            "all_to_all": [_inputs_for_all_to_all(src)[rank].tolist() for src in range(WORLD)],
            "all_to_all_even": [(_x(src, 2) + 50 * rank).tolist() for src in range(WORLD)],
        })
        per_rank[-1]["all_to_all_single"] = sum(per_rank[-1]["all_to_all_single"], [])
    return per_rank


FALLBACK_OPS = ("all_reduce_avg", "reduce_scatter_tensor", "reduce_scatter",
                "all_gather_into_tensor", "all_to_all_single", "all_to_all", "monitored_barrier")


# --------------------------------------------------------------------------- tests
def test_queries():
    results = run_distributed(_rank_queries, world_size=WORLD)
    for rank, got in enumerate(results):
        assert got == {"rank": rank, "size": 2, "local": rank, "backend": "gloo",
                       "available": True, "initialized": True, "ranks": [0, 1],
                       "global_of_1": 1, "group_size": 2}


def test_reductions():
    x0, x1 = _x(0), _x(1)
    for rank, got in enumerate(run_distributed(_rank_reductions, world_size=WORLD)):
        assert got["sum"] == (x0 + x1).tolist()
        assert got["max"] == torch.maximum(x0, x1).tolist()
        assert got["avg"] == ((x0 + x1) / 2).tolist()
        assert got["inference"] == (x0 + x1).tolist()
        assert got["async"] == (x0 + x1).tolist()
        assert got["reduce_on_dst"] == ((x0 + x1).tolist() if rank == 0 else None)


def test_broadcast_gather_scatter():
    x = [_x(0), _x(1)]
    for rank, got in enumerate(run_distributed(_rank_movement, world_size=WORLD)):
        assert got["broadcast"] == x[1].tolist()
        assert got["broadcast_object"] == [{"from": 1}]
        assert got["all_gather"] == [x[0].tolist(), x[1].tolist()]
        assert got["all_gather_object"] == [("rank", 0), ("rank", 1)]
        assert got["gather"] == ([x[0].tolist(), x[1].tolist()] if rank == 0 else None)
        assert got["scatter"] == (x[rank] * 2).tolist()


def test_point_to_point_and_barriers():
    for rank, got in enumerate(run_distributed(_rank_point_to_point, world_size=WORLD)):
        peer = 1 - rank
        assert got == {"blocking": _x(peer).tolist(), "sender": peer,
                       "async": (_x(peer) + 100).tolist()}


@pytest.mark.parametrize("forced, use_subgroup", [
    ((), False),
    (FALLBACK_OPS, False),
    (FALLBACK_OPS, True),
    (("all_to_all",), False),  # list all_to_all over the native all_to_all_single
], ids=["native", "all-fallbacks", "all-fallbacks-subgroup", "all_to_all-over-native-single"])
def test_ops_with_fallbacks_agree_with_the_reference(forced, use_subgroup):
    expected = _expected_fallback_family()
    results = run_distributed(_rank_fallback_family, world_size=WORLD,
                              args=(forced, use_subgroup))
    for rank, got in enumerate(results):
        known = got.pop("known")
        assert got == expected[rank]
        if not forced:  # the probe found every native op supported on this torch's gloo
            assert all(known.values()), known
