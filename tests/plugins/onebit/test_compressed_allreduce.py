"""The 1-bit error-compensated all-reduce on 2 and 3 gloo ranks (3 exercises the padding rule
``P * divider``): equal to the closed form, telescoping, and its bytes counted on the wire."""
import pytest
import torch

from deepspeed.testing.distributed import run_distributed

from onebit_reference import SHAPES, ReferenceCompressor, padded, rank_inputs

STEPS = 4


def _compressor():
    from deepspeed import comm as dist
    from deepspeed.onebit.compressed import CompressedAllreduce
    from deepspeed.onebit.transports import make_transport

    transport = make_transport("compressed")
    assert transport.world_size == dist.get_world_size()
    return CompressedAllreduce(transport, SHAPES, "cpu")


def _closed_form():
    from deepspeed import comm as dist

    rank, world = dist.get_rank(), dist.get_world_size()
    ours, reference = _compressor(), ReferenceCompressor(world)
    worst = 0.0
    for step in range(STEPS):
        got = ours(rank_inputs(rank, step))
        want = reference([rank_inputs(r, step) for r in range(world)])
        for g, w in zip(got, want):
            assert g.shape == w.shape
            worst = max(worst, float((g - w).abs().max()))
    return worst


@pytest.mark.parametrize("world", [2, 3])
def test_equals_closed_form(world):
    assert max(run_distributed(_closed_form, world_size=world)) < 1e-5


def _telescoping():
    from deepspeed import comm as dist

    rank, world = dist.get_rank(), dist.get_world_size()
    ours = _compressor()
    total_out = [torch.zeros(s) for s in SHAPES]
    total_in = [torch.zeros(s) for s in SHAPES]
    for step in range(12):
        for acc, value in zip(total_out, ours(rank_inputs(rank, step))):
            acc += value
        for r in range(world):
            for acc, value in zip(total_in, rank_inputs(r, step)):
                acc += value / world
    workers = [torch.empty_like(ours.worker_error) for _ in range(world)]
    dist.all_gather(workers, ours.worker_error)
    servers = [torch.empty_like(ours.server_error) for _ in range(world)]
    dist.all_gather(servers, ours.server_error)
    worker_mean = ours.from_chunks(torch.stack(workers).mean(0))
    server = ours.from_chunks(torch.stack(servers))  # row j: rank j's chunk
    gap = max(float((o + w + s - i).abs().max())
              for o, w, s, i in zip(total_out, worker_mean, server, total_in))
    naive = max(float((o - i).abs().max()) for o, i in zip(total_out, total_in))
    return gap, naive


@pytest.mark.parametrize("world", [2, 3])
def test_error_feedback_telescopes(world):
    for gap, naive in run_distributed(_telescoping, world_size=world):
        assert gap < 1e-4
        assert naive > 1e-2  # the errors are really carrying something


def _bytes_on_the_wire():
    from deepspeed import comm as dist

    world = dist.get_world_size()
    ours = _compressor()
    records = []
    dist.add_comm_observer(records.append)
    try:
        ours(rank_inputs(dist.get_rank(), 0))
    finally:
        dist.remove_comm_observer(records.append)
    return [(r.op, r.size_bytes) for r in records], ours.transport.bytes_sent, world


@pytest.mark.parametrize("world", [2, 3])
def test_payload_is_one_bit_per_element(world):
    for records, counted, p in run_distributed(_bytes_on_the_wire, world_size=world):
        n = sum(padded(torch.Size(s).numel(), p) for s in SHAPES)
        scales = 2 * 4 * len(SHAPES)
        assert [op for op, _ in records] == ["all_to_all_single", "all_gather", "all_gather",
                                            "all_gather"]
        assert sum(size for _, size in records) == n // 8 + n // (8 * p) + scales == counted


def _zeros_and_single_rank():
    from deepspeed.onebit.compressed import CompressedAllreduce
    from deepspeed.onebit.transports import make_transport

    ours = CompressedAllreduce(make_transport("compressed"), [(16,)], "cpu")
    return ours([torch.zeros(16)])[0].abs().max().item()


def test_all_zero_input_gives_zero():
    assert run_distributed(_zeros_and_single_rank, world_size=2) == [0.0, 0.0]


def test_packing_round_trip_and_numpy_layout():
    import numpy as np

    from deepspeed.onebit.packing import pack_signs, unpack_signs

    x = torch.randn(3, 64)
    x[0, :5] = 0.0  # zero counts as positive
    packed = pack_signs(x)
    assert packed.dtype == torch.uint8 and packed.shape == (3, 8)
    assert torch.equal(packed, torch.from_numpy(np.packbits((x >= 0).numpy(), axis=-1)))
    assert torch.equal(unpack_signs(packed), torch.where(x >= 0, 1.0, -1.0))
    with pytest.raises(ValueError, match="multiple of 8"):
        pack_signs(torch.randn(7))


def test_torch_kernels_match_numpy_bytes():
    """The pure-torch kernels (used off the CPU without cupy) give numpy's bytes and signs."""
    import numpy as np

    from deepspeed.onebit.packing import pack_bits_torch, unpack_signs, unpack_signs_torch

    x = torch.randn(4096)
    x[::7] = 0.0
    packed = pack_bits_torch(x >= 0)
    assert torch.equal(packed, torch.from_numpy(np.packbits((x >= 0).numpy())))
    every_byte = torch.arange(256, dtype=torch.uint8)
    assert torch.equal(unpack_signs_torch(every_byte), unpack_signs(every_byte))
    assert torch.equal(unpack_signs_torch(packed, torch.float64),
                       torch.where(x >= 0, 1.0, -1.0).double())


def test_padding_rule_documented_divider():
    from deepspeed.onebit.compressed import divider, padded_size

    assert [divider(p) for p in (1, 2, 3, 4, 8, 16)] == [8, 8, 24, 8, 8, 16]
    assert padded_size(15, 2) == 16 and padded_size(17, 2) == 32
    assert padded_size(1, 3) == 72 and padded_size(73, 3) == 144


def _upstream_backends():
    from deepspeed import comm as dist
    from deepspeed.onebit.compressed import CompressedAllreduce, padded_size
    from deepspeed.onebit.transports import make_transport
    from deepspeed.runtime.comm.compressed import CompressedBackend
    from deepspeed.runtime.comm.nccl import NcclBackend

    world, rank = dist.get_world_size(), dist.get_rank()
    ours = CompressedAllreduce(make_transport("compressed"), [torch.Size([100])], "cpu")
    results = []
    for backend in (NcclBackend(), CompressedBackend()):
        n = padded_size(100, world)
        worker_error, server_error = torch.zeros(n), torch.zeros(n // world)
        for step in range(3):
            x = torch.randn(100, generator=torch.Generator().manual_seed(10 * rank + step))
            buffer = x.clone()
            backend.compressed_allreduce(buffer, worker_error, server_error, 0)
            if len(results) < 3:
                (want,) = ours([x])
                results.append(torch.equal(buffer, want))
        results.append(worker_error.abs().sum() > 0 and server_error.abs().sum() > 0)
    return results


def test_upstream_backend_classes_import_and_reduce():
    import deepspeed.runtime.comm.mpi as mpi

    assert hasattr(mpi, "MpiBackend")
    for results in run_distributed(_upstream_backends, world_size=2):
        assert all(results), results
