"""Upstream package ``deepspeed.runtime.comm``: the 1-bit communication backends' import paths
(``nccl.NcclBackend``, ``mpi.MpiBackend``, ``compressed.CompressedBackend``), each a thin class
over ``deepspeed.onebit``'s transports and compressed all-reduce."""

from deepspeed.utils.lazy_exports import lazy_exports  # noqa: E402

# submodules load on first attribute access (`deepspeed.x.y.z` after a plain `import deepspeed`)
__getattr__, __dir__ = lazy_exports(__name__)
