"""Which implementation an op with Triton kernels runs: the kernels or its torch path.

Shared by ``deepspeed.ops.transformer`` and ``deepspeed.ops.deepspeed4science``. ``auto`` (the
default) picks Triton for CUDA tensors when Triton imports, and the torch path otherwise.
``triton`` forces the kernels: on CPU tensors that needs the Triton interpreter
(``TRITON_INTERPRET=1`` set before Triton is imported), which the tests use to check the kernels
without a GPU. ``torch`` forces the torch path everywhere.
"""
import importlib
import os

BACKENDS = ("auto", "torch", "triton")


def triton_status():
    """``(importable, version or why not)`` for the ``triton`` package."""
    try:
        triton = importlib.import_module("triton")
    except ImportError as err:
        return False, f"triton is not installed ({err}); pip install triton"
    return True, getattr(triton, "__version__", "unknown version")


def interpreter_on():
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def use_triton(tensor, backend, env_var, op):
    """True when ``tensor`` should go through the Triton kernels of ``op``.

    ``backend`` is the caller's choice (None: ``$env_var``, else ``auto``); a forced ``triton``
    that cannot run here is an error that says why, never a silent fallback.
    """
    if backend is None:
        backend = os.environ.get(env_var, "auto")
    if backend not in BACKENDS:
        raise ValueError(f"{op} backend {backend!r} is not known; allowed: {', '.join(BACKENDS)} "
                         f"(argument backend= or ${env_var})")
    if backend == "torch":
        return False
    ok, why = triton_status()
    if backend == "auto":
        return ok and tensor.is_cuda
    if not ok:
        raise RuntimeError(f"{op} backend 'triton' was asked for, but {why}")
    if not tensor.is_cuda and not interpreter_on():
        raise RuntimeError(f"{op} backend 'triton' needs a CUDA tensor, or the Triton interpreter "
                           f"(TRITON_INTERPRET=1) for a {tensor.device} tensor")
    return True
