"""Upstream path ``deepspeed.runtime.comm.nccl``: ``NcclBackend`` (over ``deepspeed.comm``)."""
from ._backend import OneBitBackend


class NcclBackend(OneBitBackend):
    backend_name = "nccl"

    def __init__(self, mpu=None):
        super().__init__(mpu=mpu)
