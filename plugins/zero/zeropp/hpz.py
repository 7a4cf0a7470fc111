"""hpZ: a secondary copy of every (non-persistent) parameter, partitioned within the node.

The forward all-gather runs over the whole data-parallel group as in ZeRO-3; while a parameter
is whole, each rank keeps the piece it owns in its node group (``ceil(numel / node_size)``
elements: the extra memory hpZ costs, see ``extra_bytes``). Backward then gathers from these
pieces over the node group only, so no backward all-gather crosses a node. An optimizer step
makes every secondary copy stale (``invalidate``); the next forward refreshes it.
Frozen weights stored quantized (MixZ++) keep their secondary piece quantized too.
"""
import torch

from deepspeed.zero.shard_comm import Route
from deepspeed.zero.zeropp.quantize import WEIGHT_BLOCK, packed_nbytes, quantize_packed
from deepspeed.zero.zeropp.transport import PackedRoute


def _piece_numel(param, size):
    return -(-max(param.ds_numel, 1) // size)


class HierarchicalPartition:

    def __init__(self, nodes, transport=None):
        self.size = nodes.node_size
        self.index = nodes.local
        self.epoch = 0
        self.route = Route(nodes.intra, transport, shard=lambda p: p.ds_secondary_tensor)
        self.packed_route = PackedRoute(nodes.intra, payload=lambda p: p.ds_secondary_packed,
                                        numel_of=lambda p: _piece_numel(p, self.size))

    def capture(self, params):
        """``params`` are whole: keep this rank's node-group piece of each."""
        with torch.no_grad():
            for param in params:
                if param.ds_persist:  # whole until the step: never gathered in backward
                    continue
                size = _piece_numel(param, self.size)
                flat = param.data.reshape(-1)
                lo = min(self.index * size, param.ds_numel)
                hi = min(lo + size, param.ds_numel)
                piece = torch.zeros(size, dtype=param.dtype, device=flat.device)
                piece[:hi - lo] = flat[lo:hi]
                if getattr(param, "ds_quantized", None) is not None:
                    param.ds_secondary_packed = quantize_packed(piece, WEIGHT_BLOCK)
                else:
                    param.ds_secondary_tensor = piece
                param.ds_secondary_epoch = self.epoch

    def route_for(self, param):
        """The backward route of ``param``, or None when its secondary copy is stale."""
        if getattr(param, "ds_secondary_epoch", None) != self.epoch:
            return None
        if getattr(param, "ds_quantized", None) is not None:
            return self.packed_route
        return self.route

    def invalidate(self):
        self.epoch += 1

    @staticmethod
    def held_bytes(params):
        """Bytes of the secondary copies ``params`` hold right now."""
        total = 0
        for param in params:
            for name in ("ds_secondary_tensor", "ds_secondary_packed"):
                piece = getattr(param, name, None)
                if piece is not None:
                    total += piece.numel() * piece.element_size()
        return total

    def extra_bytes(self, params):
        """Bytes of the secondary copies of ``params`` (what hpZ adds per rank)."""
        total = 0
        for param in params:
            if getattr(param, "ds_persist", False):
                continue
            size = _piece_numel(param, self.size)
            if getattr(param, "ds_quantized", None) is not None:
                total += packed_nbytes(size, WEIGHT_BLOCK, 8)
            else:
                total += size * param.element_size()
        return total
