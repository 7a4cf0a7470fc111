"""Which implementation runs a block-sparse op: the Triton kernels or the blocked torch path.

``auto`` (the default) picks Triton for CUDA tensors when Triton imports, and the torch path
otherwise. On the torch path ``SparseSelfAttention`` runs the fused row-group attention
(``row_groups.py``: one SDPA call per stack of query rows sharing their key blocks; the fast CPU
path, see ``tools/bench/sparse_attention_bench.py``); the separate ops (``MatMul``,
``Softmax``) run the blocked torch kernels (``torch_kernels.py``). ``blocked`` makes
``SparseSelfAttention`` compose the blocked ops too (the path before the row-group one: kept for
comparison and as a fallback).
``triton`` forces the kernels: on CPU tensors that needs the Triton interpreter
(``TRITON_INTERPRET=1`` set before Triton is imported), which the tests use to check them
without a GPU. ``DS_SPARSE_ATTENTION_BACKEND`` sets the default for a process.
"""
import importlib
import os

from deepspeed.ops.triton_support import refuse_unrunnable_triton

BACKENDS = ("auto", "torch", "blocked", "triton")
BACKEND_ENV = "DS_SPARSE_ATTENTION_BACKEND"


def triton_status():
    """``(importable, version or why not)`` for the ``triton`` package."""
    try:
        triton = importlib.import_module("triton")
    except ImportError as err:
        return False, (f"triton is not installed ({err}); install the extra: "
                       f"pip install 'deepspeed[sparse]'")
    return True, getattr(triton, "__version__", "unknown version")


def check_backend(name):
    if name is None:
        name = os.environ.get(BACKEND_ENV, "auto")
    if name not in BACKENDS:
        raise ValueError(f"sparse attention backend {name!r} is not known; allowed: "
                         f"{', '.join(BACKENDS)} (argument backend= or ${BACKEND_ENV})")
    return name


def kernels_for(tensor, backend=None):
    """The kernel module (``triton_kernels`` or ``torch_kernels``) to run ``tensor`` with."""
    backend = check_backend(backend)
    if backend == "auto":
        backend = "triton" if tensor.is_cuda and triton_status()[0] else "torch"
    if backend in ("torch", "blocked"):
        return importlib.import_module("deepspeed.sparse_attention.torch_kernels")
    refuse_unrunnable_triton(tensor, "sparse attention", triton_status())
    return importlib.import_module("deepspeed.sparse_attention.triton_kernels")
