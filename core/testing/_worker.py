"""The rank side of `deepspeed.testing.distributed`: join the group once, then run test functions.

A worker is a spawned interpreter that sets the launcher variables for its rank, calls
`deepspeed.comm.init_distributed()` and then serves "run" requests from the test process until
told to stop, so N ranks pay for importing torch and the rendezvous once per session.
"""
import faulthandler
import gc
import importlib
import importlib.util
import os
import pickle
import signal
import sys
import threading
import time
import traceback
from dataclasses import dataclass
from typing import Optional

STACK_DUMP_SIGNAL = getattr(signal, "SIGUSR1", None)


@dataclass(frozen=True)
class FunctionRef:
    """How a worker finds the test function: by module name, else by loading the module's file.

    Workers start before pytest imports later test modules and puts their folders on sys.path, so
    a plain import by name can fail (or find a different module of the same name) in a worker.
    """

    module: str
    file: Optional[str]
    qualname: str

    @classmethod
    def of(cls, fn):
        module = getattr(fn, "__module__", None)
        qualname = getattr(fn, "__qualname__", None)
        if not module or not qualname or "<lambda>" in qualname or "<locals>" in qualname:
            raise TypeError(f"the ranks run in other processes and find the function by name, so "
                            f"it must be defined at module level (not a lambda or nested "
                            f"function); got {fn!r}")
        file = getattr(sys.modules.get(module), "__file__", None)
        return cls(module, os.path.realpath(file) if file else None, qualname)

    def describe(self):
        return f"{self.module}.{self.qualname}"


_modules_by_file = {}


def _same_file(module, file):
    found = getattr(module, "__file__", None)
    return found is not None and os.path.realpath(found) == file


def _load_module(ref):
    if ref.file in _modules_by_file:
        return _modules_by_file[ref.file]
    try:
        module = importlib.import_module(ref.module)
    except ImportError:
        module = None
    if module is not None and (ref.file is None or _same_file(module, ref.file)):
        return module
    if ref.file is None:
        raise ImportError(f"cannot import {ref.module!r} in the rank process, and its file is "
                          "unknown")
    # the name may be taken by another file (two test folders with a same-named module)
    name = ref.module
    if name in sys.modules:
        name = f"_ds_testing_{len(_modules_by_file)}_{ref.module}"
    spec = importlib.util.spec_from_file_location(name, ref.file)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    _modules_by_file[ref.file] = module
    return module


def resolve(ref: FunctionRef):
    target = _load_module(ref)
    for part in ref.qualname.split("."):
        target = getattr(target, part)
    return target


def _watch_parent(parent_pid):
    """Exit when the test process is gone, even while a test function is stuck in a collective."""
    while True:
        time.sleep(1.0)
        try:
            # signal 0 only checks existence (a forkserver rank's parent is the server, not us)
            os.kill(parent_pid, 0)
        except ProcessLookupError:
            os._exit(3)


def _reset_between_tasks(saved_env):
    """Undo what one test function may have changed in this long-lived process."""
    os.environ.clear()
    os.environ.update(saved_env)
    import torch

    torch.set_default_dtype(torch.float32)
    torch.set_grad_enabled(True)
    from deepspeed.comm import capabilities, observers

    observers.reset()
    capabilities.reset()
    _reset_topology()
    try:
        from deepspeed.accelerator import reset_accelerator
    except ImportError:  # the accelerator package predates reset_accelerator: nothing cached
        return
    reset_accelerator()


def _reset_topology():
    """No engine stays current and no model-parallel unit stays registered for the next test:
    a test that failed before ``engine.destroy()``, or that called ``groups.set_mpu``, would
    otherwise leave the next one answering "data" from its unit (an MoE layer then saw a
    data-parallel size of 1 on 2 ranks). The process topology's groups are kept: they are
    shared per layout, and rebuilding them is a collective per test."""
    from deepspeed import comm as dist
    from deepspeed import topology

    topology.activate(None)
    if dist.is_initialized():
        topology.set_unit(None)


def _healthy(init, world_size):
    if not init:
        return True
    import deepspeed.comm as dist

    return dist.is_initialized() and dist.get_world_size() == world_size


def _run_task(ref, payload, env, init, world_size):
    saved_env = dict(os.environ)
    try:
        fn = resolve(ref)
        args, kwargs = pickle.loads(payload)
        os.environ.update(env)
        result = fn(*args, **kwargs)
        reply = ("ok", pickle.dumps(result))
    except BaseException:  # report everything, SystemExit included, with its traceback
        reply = ("error", traceback.format_exc())
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
    try:
        _reset_between_tasks(saved_env)
        healthy = _healthy(init, world_size)
    except BaseException:
        return ("error", traceback.format_exc(), False)
    return reply + (healthy,)


def worker_main(rank, world_size, port, conn, env, init, init_kwargs, dump_path, parent_pid):
    # `env` is the test process's environment plus overrides: a forkserver child would otherwise
    # inherit the server's environment from when the server started
    os.environ.clear()
    os.environ.update(env)
    # what the launcher sets for a one-node job (LOCAL_SIZE: the CPU accelerator's device count)
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world_size),
                      LOCAL_SIZE=str(world_size), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1")
    threading.Thread(target=_watch_parent, args=(parent_pid,), daemon=True).start()
    dump_file = open(dump_path, "w")  # stays open: faulthandler writes here on STACK_DUMP_SIGNAL
    if STACK_DUMP_SIGNAL is not None:
        faulthandler.register(STACK_DUMP_SIGNAL, file=dump_file, all_threads=True)
    try:
        import torch

        torch.set_num_threads(1)
        if init:
            import deepspeed.comm as dist

            dist.init_distributed(**init_kwargs)
    except BaseException:
        conn.send(("init_error", traceback.format_exc(), False))
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)
    # what this rank inherited and imported (torch, deepspeed) lives until it exits: out of the
    # collector's sight, a full collection walks only the tests' own objects (0.1-0.5 s each
    # otherwise) and no longer writes to, and so copies, every page shared with the forkserver
    gc.freeze()
    conn.send(("ready", None, True))
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):
            break
        if message[0] == "stop":
            break
        _, ref, payload, call_env = message
        conn.send(_run_task(ref, payload, call_env, init, world_size))
    sys.stdout.flush()
    sys.stderr.flush()
    # no interpreter tear-down: a peer may already be gone, and gloo's destructors could wait on it
    os._exit(0)
