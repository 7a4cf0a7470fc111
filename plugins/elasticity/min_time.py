"""``elasticity.min_time``: the least time, in minutes, between a (re)start of the workers and
the next scale-up.

torch elastic's agent polls its rendezvous handler's ``num_nodes_waiting()`` while the workers
run and restarts them with the larger group as soon as a node waits. ``MinTimeRendezvous`` wraps
the c10d handler and reports no waiting node until ``min_time`` has passed since the last
rendezvous (``admitted``), so a job is not torn down and resumed from its checkpoint more often
than that. Restarts after a failure are not delayed: a dead worker cannot wait.

The agent runs in the launcher, which never builds the engine: it reads the section from the
config file the script gets as ``--deepspeed_config`` (``min_time_from_args``). The gate is the
rendezvous backend ``BACKEND``, registered in torch's handler registry (its extension point).
torch is imported only when the backend is registered: ``--dry_run`` plans without it.
"""
import json
import time

BACKEND = "deepspeed-c10d-min-time"
MIN_TIME_KEY = "deepspeed_min_time_s"  # the rendezvous config entry carrying min_time (seconds)


def admitted(waiting, seconds_since_start, min_time_s):
    """The waiting nodes the agent may take in now: none before ``min_time_s`` has passed since
    the workers last (re)started."""
    return waiting if seconds_since_start >= min_time_s else 0


def min_time_from_args(user_args):
    """``elasticity.min_time`` in seconds from the ``--deepspeed_config`` file among the
    script's arguments (0 without one, or without an enabled elasticity section)."""
    from deepspeed.elasticity.elasticity import parse_elastic_config

    path = None
    for idx, arg in enumerate(user_args):
        if arg == "--deepspeed_config" and idx + 1 < len(user_args):
            path = user_args[idx + 1]
        elif arg.startswith("--deepspeed_config="):
            path = arg.split("=", 1)[1]
    if path is None:
        return 0
    with open(path, encoding="utf-8") as handle:
        section = json.load(handle).get("elasticity")
    if not section or not section.get("enabled", False):
        return 0
    return parse_elastic_config(section).min_time * 60


class MinTimeRendezvous:
    """A rendezvous handler (torch's ``RendezvousHandler`` interface, by delegation) that holds
    waiting nodes back until ``min_time_s`` after the last rendezvous (``clock``: seconds,
    monotonic)."""

    def __init__(self, inner, min_time_s, clock=time.monotonic):
        self.inner, self.min_time_s, self.clock = inner, min_time_s, clock
        self.started_at = clock()

    def __getattr__(self, name):  # the rest of the interface is the inner handler's
        return getattr(self.inner, name)

    def next_rendezvous(self):
        info = self.inner.next_rendezvous()
        self.started_at = self.clock()
        return info

    def num_nodes_waiting(self):
        return admitted(self.inner.num_nodes_waiting(), self.clock() - self.started_at,
                        self.min_time_s)


def _create(params):
    """The registry's creator: torch's c10d handler, gated by the configured min_time."""
    from torch.distributed.elastic.rendezvous import (RendezvousParameters,
                                                      rendezvous_handler_registry)

    config = dict(params.config)
    min_time_s = float(config.pop(MIN_TIME_KEY, 0))
    inner = rendezvous_handler_registry.create_handler(RendezvousParameters(
        "c10d", params.endpoint, params.run_id, params.min_nodes, params.max_nodes,
        params.local_addr, **config))
    return MinTimeRendezvous(inner, min_time_s)


def register_backend():
    """Make ``BACKEND`` known to torch elastic (idempotent)."""
    from torch.distributed.elastic.rendezvous import rendezvous_handler_registry

    rendezvous_handler_registry.register(BACKEND, _create)
