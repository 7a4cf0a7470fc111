"""Run a function on N gloo CPU ranks: the one distributed test helper of the project.

    from deepspeed.testing.distributed import run_distributed

    def _sum_of_ranks():                      # module level: ranks find it by name
        import deepspeed.comm as dist, torch
        t = torch.tensor([float(dist.get_rank())])
        dist.all_reduce(t)
        return t.item()

    def test_sum():
        assert run_distributed(_sum_of_ranks, world_size=2) == [1.0, 1.0]

Starting a rank costs seconds (importing torch, the rendezvous), so by default the ranks are a
persistent pool: N spawned processes with an initialised group that run one test function after
another. A failure or a timeout tears the pool down (the next call starts a fresh one), so one bad
test cannot poison the next. `fresh=True`, `init=False` or `init_kwargs` run on new processes
that are stopped afterwards, for tests that need their own environment or initialisation.
"""
from __future__ import annotations

import atexit
import functools
import multiprocessing
import os
import pickle
import random
import shutil
import socket
import tempfile
import time
from collections import OrderedDict
from multiprocessing import connection

from deepspeed.testing import warm_python
from deepspeed.testing._worker import STACK_DUMP_SIGNAL, FunctionRef, worker_main

# A rank that is the first to use a JIT-built op compiles it (a minute or more on a loaded 2-core
# machine, and the build must not be killed half-way); pytest-timeout still bounds the test.
DEFAULT_TIMEOUT = 180.0
START_TIMEOUT = 120.0
# After one rank fails the others usually wait in a collective for it; this long is given to
# ranks that are merely finishing before the pool is killed.
FAILURE_GRACE = 3.0
MAX_POOLS = 3  # world sizes kept warm at once (each rank holds a torch interpreter in memory)
# "spawn": every rank a fresh interpreter (~2-5 s to import torch). "forkserver" (the default):
# ranks are forked from one clean server process (never from pytest) that imported torch once,
# so fresh pools and restarts after a failure take ~0.6 s instead of ~5 s.
START_METHOD_ENV = "DS_TEST_START_METHOD"
START_METHODS = ("spawn", "forkserver")
# Imported once by the forkserver, so every rank starts with them: what the warm Python server
# preloads for every program (torch._dynamo, pydantic: see warm_python.WATCHED_PRELOAD), torch's
# cpp_extension (every op load; it brings setuptools, which the warm server does not preload:
# pip builds forked from it broke, and ranks run no pip) and deepspeed.comm's initialization
# (every rank runs it). A suite extends the list, before its first pool starts, with what its
# rank functions import at a cost (the forkserver skips a module that is not installed).
PRELOAD = [*warm_python.PRELOAD, *warm_python.WATCHED_PRELOAD, "torch.utils.cpp_extension",
           "deepspeed.comm", "deepspeed.comm.initialization", "deepspeed.testing._worker"]


class DistributedTestError(AssertionError):
    """A rank raised, crashed or did not finish; the message holds every rank's story."""

    def __init__(self, message, failures=None, unfinished=()):
        super().__init__(message)
        self.failures = dict(failures or {})  # rank -> traceback text
        self.unfinished = list(unfinished)  # ranks that never replied


class DistributedTimeoutError(DistributedTestError):
    """No rank failed, but some did not finish within the timeout."""


# Rendezvous ports are drawn below the kernel's ephemeral range, from this range's start.
_PORT_FLOOR = 10000
_PICK = random.SystemRandom()  # not the `random` module's state, which tests seed


def _ephemeral_floor() -> int:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range", encoding="ascii") as ranges:
            return int(ranges.read().split()[0])
    except (OSError, ValueError, IndexError):  # not Linux: the IANA dynamic range
        return 49152


def find_free_port() -> int:
    """A TCP port free now on 127.0.0.1, for a rendezvous that a process started later binds.

    Drawn at random below the kernel's ephemeral range: a port the kernel hands out itself
    (bind to port 0) comes from the range every outgoing connection draws from too, so on a
    loaded machine running other multi-rank jobs another process took it between this check
    and the launched rank's bind (EADDRINUSE in CI). Falls back to the kernel's choice when
    nothing below the range is free."""
    floor = _ephemeral_floor()
    for _ in range(64 if floor - _PORT_FLOOR > 1000 else 0):
        port = _PICK.randrange(_PORT_FLOOR, floor)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _unwrap(fn, args, kwargs):
    """functools.partial -> (function, args, kwargs), since only module-level functions travel."""
    args, kwargs = tuple(args), dict(kwargs or {})
    while isinstance(fn, functools.partial):
        args = tuple(fn.args) + args
        kwargs = {**fn.keywords, **kwargs}
        fn = fn.func
    return fn, args, kwargs


class DistributedPool:
    """`world_size` spawned ranks with an initialised gloo group, running functions on request."""

    def __init__(self, world_size=2, *, env=None, init=True, init_kwargs=None,
                 start_timeout=START_TIMEOUT, grace=FAILURE_GRACE, start_method=None):
        if not isinstance(world_size, int) or world_size < 1:
            raise ValueError(f"world_size must be a positive int, got {world_size!r}")
        self.start_method = start_method or os.environ.get(START_METHOD_ENV) or "forkserver"
        if self.start_method not in START_METHODS:
            raise ValueError(f"start_method={self.start_method!r} (or ${START_METHOD_ENV}) must be "
                             f"one of {START_METHODS}; 'fork' would copy the test process's torch "
                             "state and threads into the ranks")
        self.world_size = world_size
        self.env = {key: str(value) for key, value in (env or {}).items()}
        self.init = init
        self.init_kwargs = {"verbose": False, **(init_kwargs or {})}
        self.start_timeout = start_timeout
        self.grace = grace
        self._procs = self._conns = self._dumps = None
        self._dump_dir = None

    # ------------------------------------------------------------------ life cycle
    @property
    def alive(self) -> bool:
        return self._procs is not None and all(p.is_alive() for p in self._procs)

    def start(self):
        """Spawn the ranks and wait until each has joined the group (a taken port is retried)."""
        self.close()
        for attempt in range(3):
            port = find_free_port()
            try:
                self._spawn(port)
                return
            except DistributedTestError as exc:
                self.close(kill=True)
                if attempt == 2 or not _port_taken(exc):
                    raise
            except BaseException:
                self.close(kill=True)
                raise

    def _spawn(self, port):
        ctx = _context(self.start_method)
        env = {**os.environ, **self.env}
        self._dump_dir = tempfile.mkdtemp(prefix="ds-ranks-")
        self._procs, self._conns, self._dumps = [], [], []
        for rank in range(self.world_size):
            parent_end, child_end = ctx.Pipe(duplex=True)
            dump = os.path.join(self._dump_dir, f"rank{rank}.stack")
            proc = ctx.Process(
                target=worker_main, name=f"ds-test-rank{rank}",
                args=(rank, self.world_size, port, child_end, env, self.init,
                      self.init_kwargs, dump, os.getpid()))
            proc.start()
            child_end.close()
            self._procs.append(proc)
            self._conns.append(parent_end)
            self._dumps.append(dump)
        replies, unfinished, _ = self._gather(self.start_timeout)
        failures = {rank: reply[1] for rank, reply in replies.items() if reply[0] != "ready"}
        if failures or unfinished:
            stacks = self._stacks(unfinished)
            raise DistributedTestError(
                _report(f"starting {self.world_size} ranks (port {port})", self.world_size,
                        failures, unfinished, stacks, self.start_timeout, failures != {},
                        self.grace),
                failures, unfinished)

    def close(self, kill=False):
        """Stop the ranks: politely when idle, by signal after a failure or if they do not exit."""
        if self._procs is None:
            return
        procs, conns = self._procs, self._conns
        self._procs = self._conns = self._dumps = None
        if not kill:
            for conn in conns:
                try:
                    conn.send(("stop",))
                except (BrokenPipeError, OSError):
                    kill = True  # that rank is already gone
            deadline = time.monotonic() + 10.0
            for proc in procs:
                proc.join(max(0.0, deadline - time.monotonic()))
        # what a rank started (a JIT build's ninja and compilers, a launcher) goes with it: an
        # orphaned build would go on compiling next to the one the next test starts
        descendants = _descendants(procs) if kill else []
        for proc in procs:
            if proc.is_alive():
                proc.terminate()
        for proc in procs:
            proc.join(2.0)
            if proc.is_alive():
                proc.kill()
                proc.join()
        _kill_all(descendants)
        for conn in conns:
            conn.close()
        if self._dump_dir is not None:
            shutil.rmtree(self._dump_dir, ignore_errors=True)
            self._dump_dir = None

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.close()

    # ------------------------------------------------------------------ running
    def run(self, fn, args=(), kwargs=None, timeout=DEFAULT_TIMEOUT, env=None):
        """fn(*args, **kwargs) on every rank; returns the per-rank results in rank order.

        `env` is applied in each rank for this call only. Raises DistributedTestError (a rank
        raised or died) or DistributedTimeoutError (ranks still running after `timeout` s).
        """
        fn, args, kwargs = _unwrap(fn, args, kwargs)
        ref = FunctionRef.of(fn)
        try:
            payload = pickle.dumps((args, kwargs))
        except Exception as exc:
            raise TypeError(f"the arguments of {ref.describe()} must be picklable to reach the "
                            f"ranks: {exc}") from exc
        call_env = {key: str(value) for key, value in (env or {}).items()}
        if not self.alive:
            self.start()
        try:
            for conn in self._conns:
                conn.send(("run", ref, payload, call_env))
            replies, unfinished, timed_out = self._gather(timeout)
        except BaseException:
            # interrupted (Ctrl-C, pytest-timeout): the ranks may still be running this function,
            # and their late replies would be read as the next call's results
            self.close(kill=True)
            raise
        failures = {rank: reply[1] for rank, reply in replies.items() if reply[0] != "ok"}
        if failures or unfinished:
            stacks = self._stacks(unfinished)
            self.close(kill=True)
            error = DistributedTestError if failures else DistributedTimeoutError
            raise error(_report(ref.describe(), self.world_size, failures, unfinished, stacks,
                                timeout, not timed_out, self.grace), failures, unfinished)
        if not all(reply[2] for reply in replies.values()):
            self.close()  # the function destroyed or reshaped the group: start afresh next time
        results = []
        for rank in range(self.world_size):
            try:
                results.append(pickle.loads(replies[rank][1]))
            except Exception as exc:
                raise DistributedTestError(f"{ref.describe()}: the result of rank {rank} cannot be "
                                           f"unpickled in the test process: {exc!r}") from exc
        return results

    def _gather(self, timeout):
        """Replies by rank, the ranks that never replied, and whether the full timeout ran out."""
        deadline = time.monotonic() + timeout
        stop_at = deadline
        pending = set(range(self.world_size))
        replies = {}
        while pending:
            remaining = stop_at - time.monotonic()
            if remaining <= 0:
                break
            waitables = [self._conns[r] for r in pending]
            waitables += [self._procs[r].sentinel for r in pending]
            ready = connection.wait(waitables, timeout=remaining)
            for rank in sorted(pending):
                conn, proc = self._conns[rank], self._procs[rank]
                if conn in ready or conn.poll():
                    try:
                        reply = conn.recv()
                    except (EOFError, OSError):
                        proc.join(1.0)
                        reply = ("died", f"rank {rank} exited with code {proc.exitcode} "
                                         "without replying", False)
                elif proc.sentinel in ready:
                    proc.join(1.0)
                    reply = ("died", f"rank {rank} exited with code {proc.exitcode} without "
                                     "replying (killed by a signal, os._exit or a crash)", False)
                else:
                    continue
                replies[rank] = reply
                pending.discard(rank)
                if reply[0] not in ("ok", "ready"):
                    stop_at = min(stop_at, time.monotonic() + self.grace)
        return replies, sorted(pending), bool(pending) and stop_at == deadline

    def _stacks(self, ranks):
        """Python stacks of live ranks (faulthandler on STACK_DUMP_SIGNAL): where they hang."""
        if STACK_DUMP_SIGNAL is None or not ranks:
            return {}
        offsets = {}
        for rank in ranks:
            proc = self._procs[rank]
            if proc.is_alive():
                offsets[rank] = os.path.getsize(self._dumps[rank])
                os.kill(proc.pid, STACK_DUMP_SIGNAL)
        stacks = {}
        deadline = time.monotonic() + 2.0
        for rank, offset in offsets.items():
            text = ""
            while time.monotonic() < deadline:
                time.sleep(0.1)
                with open(self._dumps[rank]) as handle:
                    handle.seek(offset)
                    text = handle.read()
                if text.endswith("\n") and "File" in text:
                    break
            threads = [block for block in text.strip().split("\n\n")
                       if "_watch_parent" not in block]
            stacks[rank] = "\n\n".join(threads) or "(no stack dump arrived)"
        return stacks


def _descendants(procs):
    import psutil

    found = []
    for proc in procs:
        try:
            found += psutil.Process(proc.pid).children(recursive=True)
        except psutil.Error:  # already gone
            continue
    return found


def _kill_all(processes):
    import psutil

    for process in processes:
        try:
            process.kill()
        except psutil.Error:
            continue
    psutil.wait_procs(processes, timeout=5.0)


_contexts = {}


def _context(method):
    if method not in _contexts:
        ctx = multiprocessing.get_context(method)
        if method == "forkserver":
            ctx.set_forkserver_preload(PRELOAD)
        _contexts[method] = ctx
    return _contexts[method]


def _port_taken(error):
    from deepspeed.comm.errors import mentions_port_in_use

    return mentions_port_in_use(" ".join(error.failures.values()))


def _report(what, world_size, failures, unfinished, stacks, timeout, after_failure,
            grace=FAILURE_GRACE):
    lines = []
    if failures:
        lines.append(f"{what} failed on rank(s) {sorted(failures)} of {world_size}:")
        for rank in sorted(failures):
            lines.append(f"----- rank {rank} -----")
            lines.append(failures[rank].rstrip())
    if unfinished:
        finished = sorted(set(range(world_size)) - set(unfinished) - set(failures))
        why = (f"stopped {grace:g} s after the failure above, probably waiting in a "
               "collective for the failed rank" if after_failure
               else f"killed at the {timeout:g} s timeout")
        done = f"; rank(s) {finished} finished" if finished else ""
        lines.append(f"{what}: rank(s) {unfinished} did not finish ({why}){done}.")
        for rank in unfinished:
            if rank in stacks:
                lines.append(f"----- stack of rank {rank} when it was stopped -----")
                lines.append(stacks[rank])
    return "\n".join(lines)


# --------------------------------------------------------------------------- the shared pools
_pools: "OrderedDict[int, DistributedPool]" = OrderedDict()


def get_pool(world_size=2) -> DistributedPool:
    """The session's warm pool for `world_size` (started on first use, least recent evicted)."""
    pool = _pools.pop(world_size, None) or DistributedPool(world_size)
    _pools[world_size] = pool
    while len(_pools) > MAX_POOLS:
        _, evicted = _pools.popitem(last=False)
        evicted.close()
    return pool


def shutdown_pools():
    while _pools:
        _, pool = _pools.popitem()
        pool.close()


atexit.register(shutdown_pools)


def run_distributed(fn, world_size=2, timeout=DEFAULT_TIMEOUT, args=(), kwargs=None, env=None,
                    fresh=False, init=True, init_kwargs=None):
    """fn(*args, **kwargs) on `world_size` gloo CPU ranks; the list of per-rank return values.

    Runs on the warm pool unless `fresh=True`, `init=False` (the function initialises the group
    itself) or `init_kwargs` (passed to `deepspeed.comm.init_distributed`) ask for new processes.
    `env` overrides environment variables in the ranks (for this call; at start-up when fresh).
    """
    if fresh or not init or init_kwargs:
        with DistributedPool(world_size, env=env, init=init, init_kwargs=init_kwargs) as pool:
            return pool.run(fn, args=args, kwargs=kwargs, timeout=timeout)
    return get_pool(world_size).run(fn, args=args, kwargs=kwargs, timeout=timeout, env=env)
