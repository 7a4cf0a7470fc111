"""ZeRO-Infinity parameter offload to NVMe: ZeRO-3 shards live in files while nobody uses them.

The first ``max_in_cpu`` elements of shards stay in host memory; every other shard is written to
``<nvme_path>/zero_stage_3_params/rank<r>/`` through the async I/O op (the same
``OptimizerStateSwapper`` the optimizer offload uses, holding no optimizer state) and read back
when the parameter is gathered or its shard updated. A resident shard is always the authoritative
copy: ``settle`` writes it back before dropping it, so forgetting a ``settle`` costs memory, never
data.
"""
import torch

from deepspeed.zero.offload.nvme import OptimizerStateSwapper, validate_nvme_path


class _NoOptimizer:
    state = {}


class NVMeShardStore:

    def __init__(self, nvme_path, rank, aio_kwargs=None, buffer_count=5, buffer_size=100_000_000,
                 max_in_cpu=1_000_000_000, pin_memory=False):
        path = validate_nvme_path(nvme_path, "zero_optimization.offload_param.nvme_path")
        self.buffer_size = int(buffer_size)
        self.max_in_cpu = int(max_in_cpu)
        self.in_cpu = 0
        self.swapper = OptimizerStateSwapper(_NoOptimizer(), path, rank, aio_kwargs=aio_kwargs,
                                             pin_memory=pin_memory, buffer_count=buffer_count,
                                             folder="zero_stage_3_params",
                                             # a released shard's write must not hold up the
                                             # forward that released it
                                             write_behind=True)
        self._holders = {}  # ds_id -> Parameter whose .data is the shard (or empty when on disk)
        self.reads = 0

    def adopt(self, param):
        """A freshly partitioned parameter: keep its shard in memory within ``max_in_cpu``,
        else move it to disk."""
        numel = param.ds_tensor.numel()
        if numel > self.buffer_size:
            raise ValueError(
                f"zero_optimization.offload_param.buffer_size ({self.buffer_size}) is smaller "
                f"than the shard of a parameter of {param.ds_numel} elements ({numel} per rank); "
                f"raise buffer_size to at least {numel}")
        if self.in_cpu + numel <= self.max_in_cpu:
            self.in_cpu += numel
            return
        holder = torch.nn.Parameter(param.ds_tensor, requires_grad=False)
        self._holders[param.ds_id] = holder
        self.settle(param)

    def is_offloaded(self, param):
        return param.ds_id in self._holders

    def fetch(self, param):
        """Make ``param.ds_tensor`` resident (a no-op for shards kept in memory)."""
        holder = self._holders.get(param.ds_id)
        if holder is None or not self.swapper.is_swapped(holder):
            return
        self.swapper.swap_in(holder)
        self.reads += 1
        param.ds_tensor = holder.data

    def settle(self, param):
        """Write a resident offloaded shard back and free its memory."""
        holder = self._holders.get(param.ds_id)
        if holder is None or self.swapper.is_swapped(holder):
            return
        holder.data = param.ds_tensor
        self.swapper.swap_out(holder)
        param.ds_tensor = holder.data

    def close(self):
        self.swapper.close()
