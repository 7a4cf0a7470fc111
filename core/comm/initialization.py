"""`deepspeed.init_distributed`: choose the backend, discover the launcher's variables, join.

Safe to call any number of times: once a default group exists (created here or by the user's own
`torch.distributed.init_process_group`), later calls adopt it and return.
"""
import atexit
import os
import time
from datetime import timedelta

import torch
import torch.distributed as dist

from deepspeed.comm import env_discovery, observers, state
from deepspeed.comm.errors import mentions_port_in_use, port_in_use_error
from deepspeed.utils.logging import log_per_node, logger

DEFAULT_TIMEOUT = timedelta(minutes=30)
DEFAULT_PORT = 29500
BACKEND_SETTLE_S = 0.2  # see _settle_backend_at_exit (0.05 s: ~1 abort in 80 launches)
NOT_INITIALIZED_MESSAGE = ("Distributed backend is not initialized. Please set dist_init_required "
                           "to True or initialize before calling deepspeed.initialize()")


def accelerator_backend() -> str:
    """The accelerator's communication backend ('gloo' on CPU, 'nccl' on CUDA, ...)."""
    from deepspeed.accelerator import get_accelerator  # lazy: the accelerator may import comm

    return get_accelerator().communication_backend_name()


def resolve_backend(requested=None) -> str:
    """The backend to use for `requested` (None: the accelerator's), checked against this torch."""
    name = accelerator_backend() if requested is None else str(requested)
    if not name:
        raise ValueError("dist_backend is empty; use one of 'gloo', 'nccl', 'mpi', 'ccl', 'hccl'")
    if name.lower() == "nccl" and not torch.cuda.is_available():
        logger.warning("dist_backend='nccl' needs CUDA, which this machine lacks; using 'gloo'")
        return "gloo"
    if ":" not in name and not _backend_available(name):
        raise ValueError(f"dist_backend={name!r} is not available in this torch build "
                         f"({torch.__version__}); available here: {_available_backends()}")
    return name


def _backend_available(name):
    check = getattr(dist, "is_backend_available", None)
    if check is not None:
        return check(name)
    return {"gloo": dist.is_gloo_available, "nccl": dist.is_nccl_available,
            "mpi": dist.is_mpi_available}.get(name.lower(), lambda: True)()


def _available_backends():
    names = ("gloo", "nccl", "mpi", "ucc", "xccl", "ccl", "hccl")
    return [name for name in names if _backend_available(name)]


def discover_environment(distributed_port=DEFAULT_PORT, verbose=True, environ=None):
    """Fill the rendezvous variables this launcher did not set; returns the `Discovery`."""
    environ = os.environ if environ is None else environ
    resolver = env_discovery.mpi4py_master_addr
    found = env_discovery.discover(environ, distributed_port=distributed_port,
                                   master_addr_resolver=resolver)
    environ.update(found.values)
    if verbose and found.values:
        logger.info(f"Discovered distributed environment ({found.describe()})")
    for note in found.notes if verbose else ():
        logger.info(note)
    for warning in found.warnings:
        logger.warning(warning)
    return found


def _rank_args(init_method, rank, world_size):
    """rank / world_size for init_process_group; tcp:// and file:// cannot work without them."""
    kwargs = {}
    if rank >= 0:
        kwargs["rank"] = rank
    if world_size > 0:
        kwargs["world_size"] = world_size
    if init_method is not None and not str(init_method).startswith("env://"):
        for key, env_name in (("rank", "RANK"), ("world_size", "WORLD_SIZE")):
            if key not in kwargs:
                if os.environ.get(env_name) in (None, ""):
                    raise ValueError(f"init_method={init_method!r} needs an explicit {key}= (or "
                                     f"{env_name} in the environment); got {key}=-1")
                kwargs[key] = int(os.environ[env_name])
    return kwargs


def init_distributed(dist_backend=None, auto_mpi_discovery=True, distributed_port=DEFAULT_PORT,
                     verbose=True, timeout=DEFAULT_TIMEOUT, init_method=None,
                     dist_init_required=None, config=None, rank=-1, world_size=-1):
    """Initialise torch.distributed for DeepSpeed, or adopt the group that already exists."""
    assert isinstance(timeout, timedelta), \
        f"timeout must be a datetime.timedelta, got {type(timeout).__name__} {timeout!r}"
    if config is not None:
        observers.configure(config=config)
    initialized = dist.is_initialized()
    if dist_init_required is None:
        dist_init_required = not initialized
    if not dist_init_required:
        assert initialized, NOT_INITIALIZED_MESSAGE
    if initialized:
        if state.origin() is None:
            state.set_default(None, origin="caller")
            if verbose:
                logger.info(f"Using the process group initialised by the caller (backend "
                            f"{dist.get_backend()}, world size {dist.get_world_size()})")
        _register_exit_hook()
        return

    backend = resolve_backend(dist_backend)
    if auto_mpi_discovery and (init_method is None or str(init_method).startswith("env://")):
        discover_environment(distributed_port=distributed_port, verbose=verbose)
    kwargs = _rank_args(init_method, rank, world_size)
    if verbose:
        log_per_node(f"Initializing torch.distributed with backend '{backend}' "
                     f"(init_method={init_method or 'env://'}, timeout={timeout})")
    try:
        dist.init_process_group(backend=backend, init_method=init_method, timeout=timeout,
                                **kwargs)
    except (RuntimeError, OSError) as exc:
        if not mentions_port_in_use(str(exc)):
            raise
        raise port_in_use_error(exc, os.environ.get("MASTER_ADDR", "?"),
                                os.environ.get("MASTER_PORT", "?")) from exc
    state.set_default(timeout, origin="deepspeed.comm")
    _register_exit_hook()


_exit_hook_registered = False


def _register_exit_hook():
    """Registered once, by the first `init_distributed`, whoever created the group: atexit
    runs hooks last-registered-first, so this one runs after those of the libraries set up
    later (Accelerate, the HF Trainer)."""
    global _exit_hook_registered
    if not _exit_hook_registered:
        atexit.register(_settle_backend_at_exit)
        _exit_hook_registered = True


def _settle_backend_at_exit():
    """Let the backend's worker threads finish before the interpreter finalizes; tear down
    the group this module created.

    Seen here (torch 2.13, gloo): ~1 in 25 two-rank runs died with SIGABRT ("terminate called
    without an active exception") after the script finished. The core dump shows a gloo worker
    thread (`ProcessGroupGloo::runLoop`) destroying its last completed `AsyncAllreduceWork`,
    whose tensors need the GIL to drop their Python objects, while the main thread was already
    in `Py_FinalizeEx`: the thread is cancelled inside a noexcept destructor. Destroying the
    group does not stop those threads once `torch._dynamo` has been imported (any
    `torch.optim` optimizer imports it and something in it keeps the group alive), so the
    main thread sleeps briefly with the GIL released: a worker still releasing its last work
    gets the GIL and finishes before finalization begins.
    The race does not depend on who created the group: a group the caller created (Accelerate
    creates its own on CPU) gets the same settle, with the same collectives behind it, but it
    is the caller's to destroy.
    """
    if not dist.is_initialized():
        return
    time.sleep(BACKEND_SETTLE_S)
    if state.origin() == "deepspeed.comm":
        from deepspeed.comm.groups import destroy_process_group

        destroy_process_group()
