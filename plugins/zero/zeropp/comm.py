"""``ZeroPPComm``: ZeRO++ and MixZ++ as a ``shard_comm.ShardComm``.

Routes, per parameter and moment:

    backward, hpZ on, fresh secondary copy   -> node group (hpZ), int8 if qwZ or stored int8
    stored quantized (MixZ++ frozen weight)  -> data-parallel group, stored int8 bytes
    anything else                            -> data-parallel group, int8 if qwZ, else plain
                                                (hpZ keeps the secondary piece once whole)

and the gradient reduce-scatter becomes qgZ's hierarchical int4 all-to-all when asked.
"""
import torch

from deepspeed.zero.shard_comm import Route, ShardComm
from deepspeed.zero.zeropp.hpz import HierarchicalPartition
from deepspeed.zero.zeropp.mixz import is_stored_quantized, store_full
from deepspeed.zero.zeropp.qgz import QuantizedReduceScatter
from deepspeed.zero.zeropp.topology import NodeGroups, ranks_per_node
from deepspeed.zero.zeropp.transport import PackedRoute, QuantizedAllGather


def in_backward():
    """Inside autograd's backward (the gathers a backward hook issues, prefetches included)."""
    return torch._C._current_graph_task_id() != -1


class ZeroPPComm(ShardComm):

    def __init__(self, dp_group, world_size, *, quantized_weights=False, hpz_size=1,
                 quantized_gradients=False, quantized_frozen=False):
        self.dp_group = dp_group
        self.quantized_weights = quantized_weights
        self.quantized_frozen = quantized_frozen
        transport = QuantizedAllGather() if quantized_weights else None
        self.nodes = None
        if hpz_size > 1 or quantized_gradients:
            key = "zero_hpz_partition_size" if hpz_size > 1 else "LOCAL_WORLD_SIZE (qgZ)"
            self.nodes = NodeGroups(dp_group, ranks_per_node(hpz_size, world_size), key)
        self.hpz = HierarchicalPartition(self.nodes, transport) if hpz_size > 1 else None
        capture = self.hpz.capture if self.hpz is not None else None
        self.primary = Route(dp_group, transport, on_gathered=capture) \
            if (transport is not None or capture is not None) else None
        self.frozen = PackedRoute(dp_group, payload=lambda p: p.ds_quantized,
                                  numel_of=lambda p: p.ds_quantized_numel, on_gathered=capture)
        if quantized_gradients:
            self.reduce_scatter = QuantizedReduceScatter(self.nodes, dp_group)

    def route(self, partitioner, param):
        if self.hpz is not None and in_backward():
            route = self.hpz.route_for(param)
            if route is not None:
                return route
        if is_stored_quantized(param):
            return self.frozen
        return self.primary

    def load_full(self, partitioner, param, full):
        if not is_stored_quantized(param):
            return False
        store_full(partitioner, param, full)
        return True

    def after_step(self):
        if self.hpz is not None:
            self.hpz.invalidate()


def zeropp_requested(zero_config):
    return bool(zero_config.zero_quantized_weights or zero_config.zero_quantized_gradients
                or zero_config.zero_quantized_nontrainable_weights
                or zero_config.zero_hpz_partition_size > 1)
