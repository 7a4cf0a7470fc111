"""The process groups a multi-node job has: ranks of one "node" (consecutive data-parallel
ranks, ``node_size`` of them) and ranks with the same local index across nodes.

ZeRO++ only depends on these groups, so a 2-node x 2 job is simulated on 4 local ranks by
building them with ``node_size=2``. The node size is ``zero_hpz_partition_size`` when hpZ is on
(the docs: set it to the GPUs per node), else the launcher's ranks per node (``LOCAL_WORLD_SIZE``
from torchrun, ``LOCAL_SIZE`` from the ``deepspeed`` launcher), else one node.
"""
import os

from deepspeed import comm as dist
from deepspeed import topology
from deepspeed.hooks import ParallelDim

INTRA_NODE, INTER_NODE = "zeropp.intra_node", "zeropp.inter_node"


def ranks_per_node(hpz_size, world):
    if hpz_size > 1:
        return hpz_size
    for name in ("LOCAL_WORLD_SIZE", "LOCAL_SIZE"):
        local = os.environ.get(name, "")
        if local.isdigit() and int(local) > 0:
            return min(int(local), world)
    return world


class NodeGroups:
    """``intra``: this rank's node group; ``inter``: the group of this rank's local index over
    all nodes (None where it would hold one rank): the topology dimensions
    ``"zeropp.intra_node"`` / ``"zeropp.inter_node"``, keyed by the config key that sized them.
    Every rank builds every group, in one order (``new_group`` is collective)."""

    def __init__(self, dp_group, node_size, what="zero_hpz_partition_size"):
        ranks = list(dist.get_all_ranks_from_group(dp_group))
        world = len(ranks)
        if node_size < 1 or world % node_size:
            raise ValueError(f"zero_optimization.{what}={node_size} must divide the data-parallel "
                             f"world size {world} (ranks per node; e.g. {_divisors(world)})")
        me = dist.get_rank(group=dp_group)
        self.node_size = node_size
        self.nodes = world // node_size
        self.node, self.local = divmod(me, node_size)
        self.intra_ranks = [ranks[n * node_size:(n + 1) * node_size] for n in range(self.nodes)]
        self.inter_ranks = [ranks[i::node_size] for i in range(node_size)]
        self.intra = self._mine(INTRA_NODE, self.intra_ranks, node_size, what)
        self.inter = self._mine(INTER_NODE, self.inter_ranks, self.nodes, what)

    @staticmethod
    def _mine(name, rank_lists, size, key):
        if size == 1:
            return None
        dim, = topology.current().add(ParallelDim(name, rank_lists, key))
        return dim.group

    def node_of(self, global_rank):
        for node, members in enumerate(self.intra_ranks):
            if global_rank in members:
                return node
        raise KeyError(global_rank)


def _divisors(n):
    return ", ".join(str(d) for d in range(1, n + 1) if n % d == 0)
