"""Upstream package ``deepspeed.runtime.comm``: the 1-bit communication backends' import paths
(``nccl.NcclBackend``, ``mpi.MpiBackend``, ``compressed.CompressedBackend``), each a thin class
over ``deepspeed.onebit``'s transports and compressed all-reduce."""
