"""What the three upstream backend classes share: ``compressed_allreduce`` on one flat buffer
with error buffers the caller owns (``worker_error``: the padded size; ``server_error``: the
padded size / world size), updated in place, result written back into ``buffer_m``."""
import torch

from deepspeed.onebit.compressed import CompressedAllreduce, padded_size
from deepspeed.onebit.transports import make_transport


class OneBitBackend:
    backend_name = "compressed"

    def __init__(self, mpu=None, cuda_aware=False):
        group = mpu.get_data_parallel_group() if mpu is not None else None
        self.transport = make_transport(self.backend_name, cuda_aware, group)
        self.size = self.world_size = self.transport.world_size
        self.rank = getattr(self.transport, "rank", 0)
        self._compressors = {}

    def compressed_allreduce(self, buffer_m, worker_error, server_error, local_rank=None):
        numel = buffer_m.numel()
        padded = padded_size(numel, self.size)
        if worker_error.numel() != padded or server_error.numel() != padded // self.size:
            raise ValueError(f"compressed_allreduce: a buffer of {numel} elements needs "
                             f"worker_error of {padded} and server_error of "
                             f"{padded // self.size} elements, got {worker_error.numel()} and "
                             f"{server_error.numel()}")
        key = (numel, buffer_m.device, worker_error.dtype)
        compressor = self._compressors.get(key)
        if compressor is None:
            compressor = CompressedAllreduce(self.transport, [torch.Size([numel])],
                                             buffer_m.device, worker_error.dtype)
            self._compressors[key] = compressor
        compressor.worker_error = worker_error.view(self.size, -1)  # updated in place
        compressor.server_error = server_error.view(-1)
        (result,) = compressor([buffer_m.reshape(-1)])
        buffer_m.copy_(result.view_as(buffer_m))
        return buffer_m
