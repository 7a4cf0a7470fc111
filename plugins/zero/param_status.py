"""``ZeroParamStatus``: where a ZeRO-3 parameter's full data is (upstream's enum, also reachable
as ``deepspeed.runtime.zero.partition_parameters.ZeroParamStatus``).

A module of its own so that the modules ``partition_parameters`` imports (``param_access``,
``torch_patches``, whose ``nn.Module.__getattr__`` watch checks it on every parameter read)
can use it too without an import circle.
"""
from enum import Enum


class ZeroParamStatus(Enum):
    AVAILABLE = 1  # full data present
    NOT_AVAILABLE = 2  # only the shard
    INFLIGHT = 3  # an all-gather is running
