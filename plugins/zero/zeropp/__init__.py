"""ZeRO++ (qwZ quantized weights, hpZ hierarchical partitions, qgZ quantized gradients) and
MixZ++ (frozen weights stored quantized) for the ZeRO-3 parameter path.

They reach ZeRO-3 through one seam, ``deepspeed.zero.shard_comm.ShardComm``: which route
(group and wire form) gathers a parameter, and which collective reduces the gradients.
``ZeroPPComm`` (``comm.py``) is the ZeRO++ implementation of it.
"""

from deepspeed.utils.lazy_exports import lazy_exports  # noqa: E402

# submodules load on first attribute access (`deepspeed.x.y.z` after a plain `import deepspeed`)
__getattr__, __dir__ = lazy_exports(__name__)
