"""DeepNVMe async I/O (`deepspeed.ops.aio`): the native `async_io` op, or its Python fallback.

`aio_handle` here is the native class when the extension builds (`AsyncIOBuilder().load()`), else
the thread-pool fallback with the same methods; `backend()` says which engine is in use
('libaio', 'pthread-pread' or 'python-threads').
"""
from __future__ import annotations

from deepspeed.ops.op_builder.async_io import AsyncIOBuilder
from deepspeed.ops.op_builder.builder import OpBuildError

from . import fallback

__all__ = ["AsyncIOBuilder", "aio_handle", "backend", "load_op"]

_op = None


def load_op(verbose=False):
    """The native module when it builds, else the fallback module (logged once, with why)."""
    global _op
    if _op is None:
        try:
            _op = AsyncIOBuilder().load(verbose=verbose)
        except OpBuildError as err:
            from deepspeed.utils.logging import logger

            logger.warning("async_io extension unavailable, using the Python thread fallback: %s", err)
            _op = fallback
    return _op


def aio_handle(block_size=1048576, queue_depth=128, single_submit=False, overlap_events=False,
               intra_op_parallelism=1):
    """A handle from the best available engine (see module docstring)."""
    return load_op().aio_handle(block_size=block_size, queue_depth=queue_depth,
                                single_submit=single_submit, overlap_events=overlap_events,
                                intra_op_parallelism=intra_op_parallelism)


def backend():
    return load_op().backend()

from deepspeed.utils.lazy_exports import lazy_exports  # noqa: E402

# submodules load on first attribute access (`deepspeed.x.y.z` after a plain `import deepspeed`)
__getattr__, __dir__ = lazy_exports(__name__)
