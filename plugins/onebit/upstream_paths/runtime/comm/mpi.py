"""Upstream path ``deepspeed.runtime.comm.mpi``: ``MpiBackend`` (mpi4py; ``deepspeed[1bit]``)."""
from ._backend import OneBitBackend


class MpiBackend(OneBitBackend):
    backend_name = "mpi"

    def __init__(self, cuda_aware=False):
        super().__init__(cuda_aware=cuda_aware)
