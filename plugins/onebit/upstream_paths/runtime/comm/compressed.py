"""Upstream path ``deepspeed.runtime.comm.compressed``: ``CompressedBackend`` (over
``deepspeed.comm``, any accelerator)."""
from ._backend import OneBitBackend


class CompressedBackend(OneBitBackend):
    backend_name = "compressed"

    def __init__(self, mpu=None):
        super().__init__(mpu=mpu)
