"""Which implementation an op with Triton kernels runs: the kernels or its torch path.

Shared by ``deepspeed.ops.transformer`` and ``deepspeed.ops.deepspeed4science``. ``auto`` (the
default) picks Triton for CUDA tensors when Triton imports, and the torch path otherwise.
``triton`` forces the kernels: on CPU tensors that needs the Triton interpreter
(``TRITON_INTERPRET=1`` set before Triton is imported), which the tests use to check the kernels
without a GPU. ``torch`` forces the torch path everywhere.
"""
import functools
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


@functools.lru_cache(maxsize=None)
def interpreter_problem():
    """None when this process's Triton interpreter runs a loop bounded by a runtime integer
    argument, else why not. Checked by running such a loop, since it is not our kernels' fault:
    Triton 3.6's interpreter hands every scalar argument to the kernel as a 1-element numpy
    array and ``range()`` calls ``int()`` on it, which NumPy 2.4.6 and 2.5.2 refuse ("only
    0-dimensional arrays can be converted to Python scalars"; Triton 3.9 squeezes the array
    first). Every kernel here that loops over a sequence or a row count then fails under such
    an interpreter, while the compiled kernels are unaffected. Only meaningful with
    ``TRITON_INTERPRET=1`` set before Triton was imported."""
    import torch
    import triton
    import triton.language as tl
    from triton.runtime.errors import InterpreterError

    @triton.jit
    def _count(out_ptr, n):
        total = 0
        for _ in range(0, n):
            total += 1
        tl.store(out_ptr, total)

    out = torch.zeros(1, dtype=torch.int32)
    try:
        _count[(1, )](out, 3)
    except InterpreterError as err:
        return (f"the Triton {triton.__version__} interpreter cannot run a loop over a runtime "
                f"integer with NumPy {importlib.import_module('numpy').__version__} ({err}); "
                f"Triton 3.9's interpreter runs it")
    if int(out[0]) != 3:
        return f"the Triton {triton.__version__} interpreter counted {int(out[0])} iterations of 3"
    return None


def chosen_backend(backend, env_var):
    """The caller's choice of backend: ``backend``, else ``$env_var``, else ``auto``."""
    return backend if backend is not None else os.environ.get(env_var, "auto")


def use_triton(tensor, backend, env_var, op):
    """True when ``tensor`` should go through the Triton kernels of ``op``.

    ``backend`` is the caller's choice (``chosen_backend``); a forced ``triton`` that cannot
    run here is an error that says why, never a silent fallback.
    """
    backend = chosen_backend(backend, env_var)
    if backend not in BACKENDS:
        raise ValueError(f"{op} backend {backend!r} is not known; allowed: {', '.join(BACKENDS)} "
                         f"(argument backend= or ${env_var})")
    if backend == "torch":
        return False
    ok, why = triton_status()
    if backend == "auto":
        return ok and tensor.is_cuda
    refuse_unrunnable_triton(tensor, op, (ok, why))
    return True


def refuse_unrunnable_triton(tensor, op, status):
    """A forced ``triton`` backend of ``op`` that cannot run ``tensor`` here raises, saying why:
    Triton missing (``status`` is ``triton_status()``'s pair, or a feature's own with its
    install hint), a host tensor without the interpreter, or an interpreter that is broken."""
    ok, why = status
    if not ok:
        raise RuntimeError(f"{op} backend 'triton' was asked for, but {why}")
    if tensor.is_cuda:
        return
    if not interpreter_on():
        raise RuntimeError(f"{op} backend 'triton' needs a CUDA tensor, or the Triton interpreter "
                           f"(TRITON_INTERPRET=1) for a {tensor.device} tensor")
    problem = interpreter_problem()
    if problem:
        raise RuntimeError(f"{op} backend 'triton' on a {tensor.device} tensor: {problem}")
