"""qgZ: ZeRO-3's gradient reduce-scatter as a hierarchical, quantized all-to-all.

The send buffer of a reduce-scatter over N = nodes x L ranks is rank-major: block ``r`` is what
rank ``r`` must receive the sum of. With rank ``r = node * L + local``:

1. intra-node all-to-all: each rank sends, to the local peer ``l``, the blocks of every rank
   whose local index is ``l`` (one per node), int4-quantized; the receiver dequantizes and sums
   the L contributions: the node's partial sums of the blocks of "its column";
2. inter-node all-to-all within the column (same local index on every node): each rank sends
   node ``n`` the partial sum of ``n``'s block, int4-quantized again; the receiver sums them:
   its own block, reduced over all N ranks.

Only step 2 crosses nodes, carrying one block per remote node at ~4.1 bits per element instead
of the reduce-scatter's N-1 blocks at 16 or 32. Everything is ``all_to_all_single`` with equal
splits, so it runs over gloo. The collective is synchronous (``async_op`` is accepted and the
result is final on return).
"""
import torch

from deepspeed import comm as dist
from deepspeed.zero.shard_comm import plain_reduce_scatter
from deepspeed.zero.zeropp.quantize import GRAD_BLOCK, dequantize_rows, fit_block, pack, quantize

GRAD_BITS = 4


def pack_rows(rows, target, bits):
    """Each row of ``rows`` (P, n) quantized on its own block grid (``fit_block``), packed row
    after row: what ``dequantize_rows`` decodes."""
    count, numel = rows.shape
    block = fit_block(numel, target)
    nblocks = -(-max(numel, 1) // block)
    padded = torch.zeros(count, nblocks * block, dtype=torch.float32, device=rows.device)
    padded[:, :numel] = rows
    q, scales = quantize(padded, block, bits)
    q, scales = q.view(count, nblocks * block), scales.view(count, nblocks)
    return torch.cat([pack(q[i], scales[i], bits) for i in range(count)])


class QuantizedReduceScatter:
    """The ``reduce_scatter(output, input, group, async_op)`` of ``shard_comm`` for qgZ."""

    def __init__(self, nodes, dp_group, block=GRAD_BLOCK, bits=GRAD_BITS):
        self.nodes, self.dp_group = nodes, dp_group
        self.block, self.bits = block, bits

    def __call__(self, output, input, group, async_op):
        if group is not self.dp_group:  # a param group reduced elsewhere: not ours to change
            return plain_reduce_scatter(output, input, group, async_op)
        nodes, local = self.nodes.nodes, self.nodes.node_size
        piece = output.numel()
        blocks = input.view(nodes, local, piece)
        # row l: the blocks of every rank with local index l, node by node
        column = self._all_to_all_sum(blocks.transpose(0, 1).reshape(local, nodes * piece),
                                      self.nodes.intra)
        mine = self._all_to_all_sum(column.view(nodes, piece), self.nodes.inter)
        output.copy_(mine)
        return None

    def _all_to_all_sum(self, rows, group):
        """Row ``i`` goes to member ``i`` of ``group``; the sum of the rows received."""
        count, numel = rows.shape
        if count == 1:
            return rows[0].float()
        send = pack_rows(rows, self.block, self.bits)
        received = torch.empty_like(send)
        dist.all_to_all_single(received, send, group=group)
        return dequantize_rows(received, count, numel, self.block, self.bits).sum(dim=0)
