"""GPUDirect Storage (`deepspeed.ops.gds`): ``gds_handle``, the aio handle's API over NVIDIA cuFile.

CUDA tensors move between GPU memory and files without a host bounce buffer; host tensors go
through pread/pwrite, so code written for ``aio_handle`` works unchanged. The native op is built
by ``GDSBuilder`` (``DS_BUILD_GDS=1`` ahead of time, else on first use). On a machine without a
CUDA build of torch or without cuFile, ``gds_handle(...)`` raises ``OpBuildError`` naming what is
missing; ``deepspeed.ops.aio.aio_handle`` is the handle to use there.
"""
from __future__ import annotations

from deepspeed.ops.op_builder.builder import OpBuildError
from deepspeed.ops.op_builder.gds import ALTERNATIVE, GDSBuilder

__all__ = ["GDSBuilder", "gds_handle", "is_available"]


def is_available():
    """Whether this machine can build and run the GDS op (``GDSBuilder().is_compatible()``)."""
    return GDSBuilder().is_compatible()


def gds_handle(block_size=1048576, queue_depth=128, single_submit=False, overlap_events=False,
               intra_op_parallelism=1):
    """A cuFile-backed handle; raises ``OpBuildError`` saying what is missing where GDS is not."""
    builder = GDSBuilder()
    if not builder.is_compatible():
        raise OpBuildError(f"gds_handle needs NVIDIA GPUDirect Storage (cuFile) with a CUDA build of "
                           f"torch, and this machine lacks it: {builder.incompatible_reason}")
    try:
        op = builder.load(verbose=False)
    except OpBuildError as err:
        raise OpBuildError(f"gds_handle: the gds op did not build ({err}); {ALTERNATIVE}") from err
    return op.gds_handle(block_size=block_size, queue_depth=queue_depth, single_submit=single_submit,
                         overlap_events=overlap_events, intra_op_parallelism=intra_op_parallelism)
