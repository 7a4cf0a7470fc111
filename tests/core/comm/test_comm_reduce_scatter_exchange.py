"""gloo's reduce-scatter of large pieces runs as a point-to-point exchange
(``backend_ops._reduce_scatter_by_exchange``): every rank gets exactly the sum of its piece,
synchronously and asynchronously, for SUM and AVG, in a subgroup, and next to a pipeline's
tag-0 point-to-point traffic between the same ranks; in-place and small pieces, and ops the
exchange does not do, take the all-reduce route and give the same answer."""
import pytest
import torch

from deepspeed.testing.distributed import run_distributed

PIECE = (1 << 20) // 4  # fp32 elements in the smallest piece the exchange takes


def _contribution(rank, world, piece):
    """Distinct per rank and element, with fractional parts so the sum order could show."""
    g = torch.Generator().manual_seed(1234 + rank)
    return torch.randn(world * piece, generator=g)


def _expected(world, piece, rank, op="sum"):
    total = _contribution(0, world, piece).clone()
    for r in range(1, world):
        total = total + _contribution(r, world, piece)
    mine = total.narrow(0, rank * piece, piece)
    return mine / world if op == "avg" else mine


def _rank_exchange(piece, op_name, async_op, subgroup, with_pipeline_traffic):
    import deepspeed.comm as dist
    from deepspeed.comm import backend_ops

    rank, world = dist.get_rank(), dist.get_world_size()
    group = dist.new_group(list(range(world))) if subgroup else None
    op = {"sum": dist.ReduceOp.SUM, "avg": dist.ReduceOp.AVG, "max": dist.ReduceOp.MAX}[op_name]
    given = _contribution(rank, world, piece)
    before = given.clone()
    out = torch.empty(piece)
    used = backend_ops._exchange_reduces(out, given, op)
    pipeline = None
    if with_pipeline_traffic:  # tag 0 messages between the same two ranks, posted first
        peer = (rank + 1) % world
        inbox = torch.empty(7)
        pipeline = [dist.irecv(inbox, src=(rank - 1) % world),
                    dist.isend(torch.full((7,), float(rank)), dst=peer)]
    work = dist.reduce_scatter_tensor(out, given, op=op, group=group, async_op=async_op)
    if async_op:
        work.wait()
    result = {"out": out, "exchange": used, "input_kept": torch.equal(given, before)}
    if pipeline:
        for w in pipeline:
            w.wait()
        result["pipeline"] = inbox.tolist()
    return result


@pytest.mark.parametrize("op_name, async_op, subgroup, pipeline", [
    ("sum", False, False, False),
    ("sum", True, False, True),
    ("avg", True, True, False),
    ("max", False, False, False),
], ids=["sum-sync", "sum-async-next-to-pipeline-p2p", "avg-async-subgroup", "max-all-reduce-route"])
def test_large_pieces_reduce_exactly(op_name, async_op, subgroup, pipeline):
    world = 2
    results = run_distributed(_rank_exchange, world_size=world,
                              args=(PIECE, op_name, async_op, subgroup, pipeline))
    for rank, got in enumerate(results):
        assert got["exchange"] is (op_name != "max")
        if op_name == "max":
            a, b = _contribution(0, world, PIECE), _contribution(1, world, PIECE)
            want = torch.maximum(a, b).narrow(0, rank * PIECE, PIECE)
        else:
            want = _expected(world, PIECE, rank, op_name)
        assert torch.equal(got["out"], want)
        assert got["input_kept"]
        if pipeline:
            assert got["pipeline"] == [float(1 - rank)] * 7


def test_small_pieces_take_the_all_reduce_route():
    results = run_distributed(_rank_exchange, world_size=2, args=(PIECE // 4, "sum", True, False,
                                                                  False))
    for rank, got in enumerate(results):
        assert got["exchange"] is False
        assert torch.equal(got["out"], _expected(2, PIECE // 4, rank))


def _rank_in_place(piece):
    import deepspeed.comm as dist
    from deepspeed.comm import backend_ops

    rank, world = dist.get_rank(), dist.get_world_size()
    flat = _contribution(rank, world, piece)
    mine = flat.narrow(0, rank * piece, piece)
    used = backend_ops._exchange_reduces(mine, flat, dist.ReduceOp.SUM)
    dist.reduce_scatter_tensor(mine, flat)
    return used, mine.clone()


def test_in_place_output_inside_the_input_is_not_exchanged():
    for rank, (used, got) in enumerate(run_distributed(_rank_in_place, world_size=2,
                                                       args=(PIECE,))):
        assert used is False
        assert torch.equal(got, _expected(2, PIECE, rank))


def test_three_ranks_sum_in_a_fixed_order():
    """Each rank sums its pieces as (first peer + other peers in rank order) + its own."""
    world = 3
    results = run_distributed(_rank_exchange, world_size=world,
                              args=(PIECE, "sum", False, False, False))
    for rank, got in enumerate(results):
        assert got["exchange"] is True
        peers = [r for r in range(world) if r != rank]
        pieces = [_contribution(r, world, PIECE).narrow(0, rank * PIECE, PIECE)
                  for r in range(world)]
        want = pieces[peers[0]].clone()
        for r in peers[1:]:
            want += pieces[r]
        want += pieces[rank]
        assert torch.equal(got["out"], want)


def _rank_polled(piece):
    import time

    import deepspeed.comm as dist

    rank, world = dist.get_rank(), dist.get_world_size()
    out = torch.empty(piece)
    work = dist.reduce_scatter_tensor(out, _contribution(rank, world, piece), async_op=True)
    deadline = time.monotonic() + 60
    while not work.is_completed():  # polling, never calling wait(): gloo p2p alone would spin
        assert time.monotonic() < deadline, "the exchange never reported completion"
        time.sleep(0.001)
    return out


def test_polling_is_completed_gives_the_finished_sum():
    for rank, got in enumerate(run_distributed(_rank_polled, world_size=2, args=(PIECE,))):
        assert torch.equal(got, _expected(2, PIECE, rank))


def _rank_alone():
    import deepspeed.comm as dist

    given = torch.arange(12, dtype=torch.float32).view(3, 4).t()  # not contiguous
    out = torch.empty(12)
    dist.reduce_scatter_tensor(out, given)
    return out, given.reshape(-1)


def test_one_rank_reduce_scatter_is_a_copy_of_any_input():
    (out, want), = run_distributed(_rank_alone, world_size=1)
    assert torch.equal(out, want)
