"""MiCS: ZeRO-3 with model states sharded over small groups and replicated across them.

With ``"zero_optimization": {"stage": 3, "mics_shard_size": S}`` the N data-parallel ranks form
N/S *shard groups* of S consecutive ranks. Every parameter, its gradient partition and its
optimizer state are cut into S shards inside each shard group, and shard group k holds exactly
the same shards as shard group 0: rank ``r`` keeps shard ``r % S``, and the ranks holding the
same shard form a *replica group* (``r % S`` equal, N/S ranks). So

- a parameter all-gather runs within the shard group only (S ranks, usually one node);
- gradients are reduce-scattered within the shard group, then each rank's reduced piece is
  all-reduced across its replica group, so every replica steps the same averaged gradient;
- the optimizer steps each rank's shard; replicas compute identical updates.

``mics_shard_size`` = N is plain ZeRO-3 (the data-parallel group itself shards; no replica
group), ``mics_shard_size`` = 1 is data parallelism (every rank holds whole parameters, the
gradients are all-reduced over everybody).

``mics_hierarchical_params_gather``: when a shard group spans several nodes (S larger than the
ranks per node, ``LOCAL_WORLD_SIZE``/``LOCAL_SIZE``), the all-gather runs in two hops: first
among the ranks of the shard group with the same local rank (one per node, the only hop that
crosses nodes), then within each node. The result is the same bytes in the same order.

Everything here plugs into the seam of ``partition_parameters.Partitioner`` (``group``,
``replica_group``, ``all_gather_into``); the optimizer and the reducer read it from the
parameters, so no other module knows about MiCS.
"""
import os
from typing import NamedTuple, Optional

import torch

from deepspeed import comm as dist
from deepspeed import topology
from deepspeed.hooks import ParallelDim
from deepspeed.utils.logging import logger
from deepspeed.zero.partition_parameters import Init, Partitioner, is_zero_param

#: the topology dimensions of MiCS, one instance per shard size
SHARD, REPLICA = "mics.shard", "mics.replica"
INTER_NODE, INTRA_NODE = "mics.inter_node", "mics.intra_node"


class MiCSGroups(NamedTuple):
    shard_size: int
    dp_size: int
    shard_group: object  # this rank's shard group (the data-parallel group when S == N)
    replica_group: Optional[object]  # this rank's replica group (None when S == N)
    inter_node_group: Optional[object] = None  # hierarchical gather, hop 1 (crosses nodes)
    intra_node_group: Optional[object] = None  # hierarchical gather, hop 2 (inside a node)
    node_size: int = 0  # ranks per node inside a shard group (hierarchical only)


def node_size_from_env(default):
    """Ranks per node: the launcher's ``LOCAL_WORLD_SIZE`` (torchrun) or ``LOCAL_SIZE``
    (``deepspeed``), else ``default``."""
    for name in ("LOCAL_WORLD_SIZE", "LOCAL_SIZE"):
        value = os.environ.get(name)
        if value and value.isdigit() and int(value) > 0:
            return int(value)
    return default


def check_shard_size(shard_size, dp_size):
    """Clear errors for a shard size that cannot cut ``dp_size`` ranks into groups."""
    if isinstance(shard_size, bool) or not isinstance(shard_size, int) or shard_size < 1:
        raise ValueError(f"zero_optimization.mics_shard_size={shard_size!r}: MiCS needs a "
                         f"positive number of ranks per shard group (-1 turns MiCS off)")
    if shard_size > dp_size or dp_size % shard_size:
        raise ValueError(f"zero_optimization.mics_shard_size={shard_size} must divide the "
                         f"data-parallel world size {dp_size} (shard groups of equal size); "
                         f"allowed: {[d for d in range(1, dp_size + 1) if dp_size % d == 0]}")


def _all_dp_rank_lists(dp_group):
    """Every data-parallel group of the job as a sorted tuple of global ranks (with model
    parallelism there are several): groups are created by every process, in one order."""
    mine = tuple(dist.get_all_ranks_from_group(dp_group)) if dp_group is not None \
        else tuple(range(dist.get_world_size()))
    if len(mine) == dist.get_world_size():
        return mine, [mine]
    every = [None] * dist.get_world_size()
    dist.all_gather_object(every, mine)
    return mine, sorted(set(map(tuple, every)))


def mics_groups(dp_group, shard_size, hierarchical=False):
    """The process groups of MiCS with ``shard_size`` ranks per shard group over the
    data-parallel group ``dp_group`` (None: the world): dimensions of the current topology
    (``"mics.shard"``, ``"mics.replica"``, and the two hops of the hierarchical gather), keyed by
    the shard size. Collective; a layout built before reuses its groups."""
    mine, all_dp = _all_dp_rank_lists(dp_group)
    dp_size = len(mine)
    check_shard_size(shard_size, dp_size)
    node = node_size_from_env(dp_size) if hierarchical else 0
    key = str(shard_size)
    if shard_size == dp_size:
        shard_group, replica_group = dp_group, None
    else:
        shards = [ranks[start:start + shard_size] for ranks in all_dp
                  for start in range(0, dp_size, shard_size)]
        replicas = [ranks[index::shard_size] for ranks in all_dp for index in range(shard_size)]
        shard_dim, replica_dim = topology.current().add(ParallelDim(SHARD, shards, key),
                                                        ParallelDim(REPLICA, replicas, key))
        shard_group, replica_group = shard_dim.group, replica_dim.group
    inter = intra = None
    if hierarchical:
        inter, intra, node = _hierarchical_groups(all_dp, mine, shard_size, node, key)
    return MiCSGroups(shard_size, dp_size, shard_group, replica_group, inter, intra, node)


def _hierarchical_groups(all_dp, mine, shard_size, node, key):
    """Hop groups of the two-hop gather, or (None, None, 0) when a shard group fits in one
    node (then the plain gather already stays inside the node)."""
    if shard_size <= node:
        logger.info(f"mics_hierarchical_params_gather: a shard group ({shard_size} ranks) fits "
                    f"in one node ({node} ranks); gathering in one hop")
        return None, None, 0
    if shard_size % node:
        raise ValueError(f"zero_optimization.mics_hierarchical_params_gather needs "
                         f"mics_shard_size ({shard_size}) to be a multiple of the ranks per node "
                         f"({node}, from LOCAL_WORLD_SIZE/LOCAL_SIZE)")
    shards = [ranks[start:start + shard_size] for ranks in all_dp
              for start in range(0, len(mine), shard_size)]
    inter, intra = topology.current().add(
        # hop 1: the same local rank of every node of a shard group; hop 2: one node
        ParallelDim(INTER_NODE, [shard[local::node] for shard in shards for local in range(node)],
                    key),
        ParallelDim(INTRA_NODE, [shard[first:first + node] for shard in shards
                                 for first in range(0, shard_size, node)], key))
    return inter.group, intra.group, node


class MiCSPartitioner(Partitioner):
    """A ``Partitioner`` over this rank's shard group, with its replica group and (optionally)
    the two-hop gather."""

    def __init__(self, groups, dp_group=None, **kwargs):
        super().__init__(groups.shard_group, **kwargs)
        self.mics = groups
        self.dp_group = dp_group
        self.replica_group = groups.replica_group

    @property
    def shard_size(self):
        return self.mics.shard_size

    def partition(self, param, source_rank=0):
        """Every shard group keeps the same shards: the whole value is first made equal on
        all data-parallel ranks (data-parallel rank ``source_rank``'s), then cut locally."""
        if is_zero_param(param):
            return param
        if self.replica_group is not None and source_rank is not None:
            with torch.no_grad():
                full = param.data.contiguous()
                src = source_rank if self.dp_group is None else \
                    dist.get_global_rank(self.dp_group, source_rank)
                dist.broadcast(full, src=src, group=self.dp_group)
                param.data = full
            source_rank = None
        return super().partition(param, source_rank=source_rank)

    def all_gather_into(self, output, send, async_op=False):
        if self.mics.inter_node_group is None:
            return super().all_gather_into(output, send, async_op=async_op)
        hierarchical_all_gather(output, send, self.mics)
        return None


def hierarchical_all_gather(output, send, groups):
    """``all_gather_into_tensor(output, send)`` over the shard group in two hops. Shard-group
    rank ``i`` sits on node ``i // L`` with local rank ``i % L`` (L ranks per node). Hop 1
    gathers, across nodes, the sends of the ranks sharing this local rank; hop 2 gathers those
    blocks within the node; the result is reordered from (local, node) to rank-major order."""
    node = groups.node_size
    nodes = groups.shard_size // node
    n = send.numel()
    across = torch.empty(nodes * n, dtype=send.dtype, device=send.device)
    dist.all_gather_into_tensor(across, send, group=groups.inter_node_group)
    within = torch.empty(node * nodes * n, dtype=send.dtype, device=send.device)
    dist.all_gather_into_tensor(within, across, group=groups.intra_node_group)
    # within[local][node_index] is rank (node_index * L + local)'s send
    output.view(nodes, node, n).copy_(within.view(node, nodes, n).transpose(0, 1))


# ---------------------------------------------------------------------- the engine's side
def mics_enabled(zero_config):
    return int(getattr(zero_config, "mics_shard_size", -1)) > 0


def check_mics_config(zero_config):
    """The combinations MiCS cannot run, refused at ``initialize``."""
    shard = int(zero_config.mics_shard_size)
    if shard == 0 or shard < -1:
        raise ValueError(f"zero_optimization.mics_shard_size={shard}: use a positive number of "
                         f"ranks per shard group, or -1 (the default) for no MiCS")
    if zero_config.mics_hierarchical_params_gather and shard <= 0:
        raise ValueError("zero_optimization.mics_hierarchical_params_gather is set but "
                         "mics_shard_size is not: the two-hop gather is a MiCS option; set "
                         "mics_shard_size to the ranks per shard group")
    if shard <= 0:
        return
    if int(zero_config.stage) != 3:
        raise ValueError(f"zero_optimization.mics_shard_size={shard} needs ZeRO stage 3 (MiCS "
                         f"shards parameters); the stage is {int(zero_config.stage)}")
    if int(getattr(zero_config, "zero_hpz_partition_size", 1)) > 1:
        raise ValueError("zero_optimization.mics_shard_size and zero_hpz_partition_size > 1 "
                         "cannot be combined: both choose the group parameters are gathered "
                         "in; use MiCS (shard groups) or hpZ (secondary partitions)")
    if zero_config.offload_param_device.value == "nvme":
        raise ValueError("zero_optimization.mics_shard_size does not support "
                         "offload_param.device 'nvme'; use 'cpu' or no parameter offload")


def make_partitioner(dp_group, zero_config, **kwargs):
    """The partitioner the engine shards its model with: MiCS's when ``mics_shard_size`` is
    set, else the plain one over the data-parallel group."""
    if not mics_enabled(zero_config):
        return Partitioner(dp_group, **kwargs)
    groups = mics_groups(dp_group, int(zero_config.mics_shard_size),
                         bool(zero_config.mics_hierarchical_params_gather))
    return MiCSPartitioner(groups, dp_group=dp_group, **kwargs)


def _ranks(group):
    return tuple(dist.get_all_ranks_from_group(group)) if group is not None else \
        tuple(range(dist.get_world_size()))


def check_partitioned_consistently(params, partitioner):
    """Parameters partitioned before ``initialize`` (``zero.Init`` / ``MiCS_Init``) must live
    in the groups the config asks for, or gathers and reductions would not pair up."""
    want = _ranks(partitioner.group)
    mics_here = isinstance(partitioner, MiCSPartitioner)
    for param in params:
        if not is_zero_param(param) or param.ds_partitioner is partitioner:
            continue
        if not (mics_here or isinstance(param.ds_partitioner, MiCSPartitioner)):
            continue  # plain ZeRO-3 handles parameters of several partitioners
        have = _ranks(param.ds_partitioner.group)
        if have != want:
            built = "deepspeed.zero.MiCS_Init" if have != _ranks(getattr(
                partitioner, "dp_group", None)) else "deepspeed.zero.Init"
            raise ValueError(
                f"the model's parameters were partitioned by {built} over ranks {list(have)}, "
                f"but zero_optimization.mics_shard_size "
                f"({getattr(partitioner, 'shard_size', 'unset')}) shards this rank's "
                f"parameters over ranks {list(want)}; build the model under "
                f"deepspeed.zero.MiCS_Init with the same config (or deepspeed.zero.Init "
                f"without mics_shard_size)")


# ---------------------------------------------------------------------- MiCS_Init
class MiCS_Init(Init):
    """``deepspeed.zero.Init`` that partitions over MiCS shard groups: the config
    (``config_dict_or_path``, required) must set ``zero_optimization.mics_shard_size``."""

    def __init__(self, module=None, data_parallel_group=None, sequence_data_parallel_group=None,
                 mem_efficient_linear=True, remote_device=None, pin_memory=False,
                 config_dict_or_path=None, config=None, enabled=True, dtype=None, mpu=None):
        source = config_dict_or_path if config_dict_or_path is not None else config
        if source is None and enabled:
            raise ValueError("deepspeed.zero.MiCS_Init needs config_dict_or_path: a DeepSpeed "
                             "config whose zero_optimization sets mics_shard_size")
        self._mics_config = _mics_section(source) if enabled else None
        if sequence_data_parallel_group is not None:
            data_parallel_group = sequence_data_parallel_group
        super().__init__(module=module, data_parallel_group=data_parallel_group,
                         mem_efficient_linear=mem_efficient_linear, remote_device=remote_device,
                         pin_memory=pin_memory, config_dict_or_path=config_dict_or_path,
                         config=config, enabled=enabled, dtype=dtype, mpu=mpu)

    def _make_partitioner(self, group, **kwargs):
        shard, hierarchical = self._mics_config
        return MiCSPartitioner(mics_groups(group, shard, hierarchical), dp_group=group, **kwargs)


def _mics_section(source):
    from deepspeed.config import load_config_source

    raw = source.raw if hasattr(source, "raw") else load_config_source(source)
    zero = raw.get("zero_optimization") or {}
    shard = zero.get("mics_shard_size", -1) if isinstance(zero, dict) else -1
    if not isinstance(shard, int) or isinstance(shard, bool) or shard < 1:
        raise ValueError(f"deepspeed.zero.MiCS_Init: the config's zero_optimization."
                         f"mics_shard_size is {shard!r}; it must be a positive number of ranks "
                         f"per shard group")
    return shard, bool(zero.get("mics_hierarchical_params_gather", False))
