"""The MPI backend's checks, run by ``test_mpi_backend.py`` as ``mpirun -np 2 python mpi_checks.py``:
the same closed form and byte count as the deepspeed.comm transport, then a short training run
with ``comm_backend_name: "mpi"``. Prints ``MPI-OK <rank>`` on success."""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import deepspeed  # noqa: E402
from deepspeed import comm as dist  # noqa: E402
from deepspeed.onebit.compressed import CompressedAllreduce  # noqa: E402
from deepspeed.onebit.transports import MPITransport, make_transport  # noqa: E402
from onebit_reference import SHAPES, ReferenceCompressor, padded, rank_inputs  # noqa: E402
from onebit_training import (config, data, engine, identical_on_all_ranks,  # noqa: E402
                             train)


def main():
    deepspeed.init_distributed(dist_backend="gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    transport = make_transport("mpi")
    assert isinstance(transport, MPITransport) and transport.world_size == world
    ours, reference = CompressedAllreduce(transport, SHAPES, "cpu"), ReferenceCompressor(world)
    for step in range(4):
        got = ours(rank_inputs(rank, step))
        want = reference([rank_inputs(r, step) for r in range(world)])
        worst = max(float((g - w).abs().max()) for g, w in zip(got, want))
        assert worst < 1e-5, f"step {step}: {worst}"
    n = sum(padded(torch.Size(s).numel(), world) for s in SHAPES)
    expected = 4 * (n // 8 + n // (8 * world) + 8 * len(SHAPES))
    assert transport.bytes_sent == expected, (transport.bytes_sent, expected)

    x, y = data(8, world)
    eng = engine(config("OneBitAdam", lr=1e-2, freeze_step=3, comm_backend_name="mpi"))
    history = train(eng, 8, x, y)
    assert eng.basic_optimizer.transport.name == "mpi"
    assert all(ops == [] for _, ops in history[3:]), history  # compressed bytes went over MPI
    assert identical_on_all_ranks(list(eng.module.parameters()))
    print(f"MPI-OK {rank}", flush=True)


if __name__ == "__main__":
    main()
