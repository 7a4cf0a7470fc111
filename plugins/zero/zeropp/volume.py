"""Bytes a rank sends, read from the comms logger's summary (``deepspeed.comm.log_summary
(return_dict=True)`` or ``CommsLogger.summary()``), in total and across "nodes".

The logger records each call's per-rank message size and the global ranks of its group. What a
rank sends to each peer of a P-rank group, counting every byte once (a direct exchange):

    all-gather       its input (size) to every peer
    reduce-scatter   the peer's piece (size = the output) to every peer
    all-to-all       size / P to every peer
    all-reduce       2 * size / P to every peer (reduce-scatter + all-gather)

``cross_node`` counts only the peers on another node. Sizes are what the logger saw: quantized
collectives are logged at their int8/int4 byte size.
"""
from collections import defaultdict

KINDS = (("all_gather", "all_gather"), ("allgather", "all_gather"),
         ("reduce_scatter", "reduce_scatter"), ("all_to_all", "all_to_all"),
         ("all_reduce", "all_reduce"))


def kind_of(name):
    base = name.split(" |")[0]
    for marker, kind in KINDS:
        if marker in base:
            return kind
    return "other"


def per_peer(kind, size, group_size):
    if kind in ("all_gather", "reduce_scatter", "other"):
        return size
    if kind == "all_to_all":
        return size / group_size
    return 2 * size / group_size


def volume(summary, rank, node_of):
    """{kind: {"total": bytes, "cross_node": bytes, "calls": n, "groups": {ranks: calls}}} of
    the calls in ``summary`` as seen by global ``rank``; ``node_of(rank)`` names a rank's node."""
    out = defaultdict(lambda: {"total": 0.0, "cross_node": 0.0, "calls": 0,
                               "groups": defaultdict(int)})
    for name, by_size in summary.items():
        kind = kind_of(name)
        for size, row in by_size.items():
            for ranks, calls in row.get("groups", {}).items():
                peers = [r for r in ranks if r != rank]
                remote = [r for r in peers if node_of(r) != node_of(rank)]
                each = per_peer(kind, size, len(ranks)) * calls
                entry = out[kind]
                entry["total"] += each * len(peers)
                entry["cross_node"] += each * len(remote)
                entry["calls"] += calls
                entry["groups"][ranks] += calls
    return {k: dict(v, groups=dict(v["groups"])) for k, v in out.items()}


def blocks_of_nodes(node_size):
    """``node_of`` for consecutive ranks ``node_size`` per node (the simulated topology)."""
    return lambda rank: rank // node_size
