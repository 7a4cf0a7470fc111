"""Upstream path ``deepspeed.utils.groups``: the same module object as
``deepspeed.topology.groups`` (the views onto the process-group topology), so either name
reads and registers the same state. It lives with the topology rather than in
``deepspeed.utils``, the floor below ``deepspeed.comm``, because answering needs the groups."""
import sys

from deepspeed.topology import groups

sys.modules[__name__] = groups
