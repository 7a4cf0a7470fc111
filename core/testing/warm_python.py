"""A warm Python server: programs a test suite starts run in forks of one interpreter that
imported torch once, instead of each paying ~2.5 CPU s for the import.

Why: the suite starts hundreds of Python programs (each rank of every ``deepspeed`` launch,
example scripts, Trainer runs) and on a 2-core machine their torch imports were a large share
of its CPU time. The rank pools (``deepspeed.testing.distributed``) solve this for functions;
this solves it for whole programs, without changing how a test starts them.

How: ``start_server()`` starts ``python warm_python.py SOCKET [MODULE ...]`` (this file run as
a script, so the server never imports the ``deepspeed`` package and every program imports it
fresh), which imports the preloaded modules and listens on a Unix socket. It sets
``DS_WARM_PYTHON`` to the socket and puts ``warm_site/`` first on ``PYTHONPATH``; from then on
every Python the tests start runs ``warm_site/sitecustomize.py`` at start-up, which sends its
program and open file descriptors here. For each, the server forks a *supervisor*, which forks
the *program*: a process that takes the client's descriptors at their numbers, its
environment, working directory, sys.path, umask, niceness and CPU affinity, rebuilds the
standard streams and runs the script or module as ``__main__``. The supervisor reports the
program's pid and, at its end, its exit status or signal to the client, which ends the same way;
a client that dies takes the program's process group with it. The client relays signals.

What differs from a fresh interpreter, and why that is accepted for tests: the program's
parent is the supervisor (``os.getppid()``, process trees, ``psutil`` children of the launcher);
its command line in ``/proc`` is the server's; every fork shares the server's str hash seed
(as the rank pools' forked ranks do); modules listed in ``PRELOAD`` and ``WATCHED_PRELOAD`` are
already imported, and in a script that imports transformers or accelerate also those of
``HF_PRELOAD`` (the "hf" flavour: a second server forked from the first). A server declines a
program whose environment differs from its own in a variable its watched or hf preloads read.
Programs that need a fresh interpreter run with ``DS_WARM_PYTHON`` unset (the client then
starts normally); the server itself declines, and the client starts normally, for ``-c``,
``-W``/``-X`` options, another interpreter or namespace, and import-time variables
(``IMPORT_TIME_ENV``) that differ from the server's.

Standard library only: this file is also imported by the suite's conftest to start the server.
Longer than 600 lines on purpose: the server runs this file as a script, outside the deepspeed
package, so starting, serving, supervising and becoming the program stay in one file.
"""
import atexit
import collections.abc
import gc
import io
import json
import os
import select
import signal
import socket
import subprocess
import sys
import tempfile
import time
import types

LOG_ENV = "DS_WARM_PYTHON_LOG"
SITE_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "warm_site")


def _load_client():
    """The client module, loaded by path: the server and the pytest process share its
    ``identity()`` / ``socket_path()`` without putting ``warm_site`` on their own sys.path."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "_ds_warm_python_client", os.path.join(SITE_DIR, "_ds_warm_python_client.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_client = _load_client()
ENV = _client.ENV  # the folder of the servers' sockets, one per network namespace
PRELOAD = ("torch",)
# imported next, by every server, while noting the environment variables they read (as the "hf"
# flavour's below): a program whose value of one of them differs from the server's starts
# normally. torch's optimizers import torch._dynamo on first use (~2 CPU s in every program that
# builds one; it brings DTensor and triton along) and every deepspeed config is a pydantic model
# (~0.5 CPU s of import). Not torch.utils.cpp_extension: it imports setuptools, and a pip build
# of a package forked with setuptools already imported failed to find its bdist_wheel command.
WATCHED_PRELOAD = ("torch._dynamo", "pydantic")
# the "hf" flavour: a second server, forked from the first once torch is imported, that has also
# imported the Hugging Face stack (transformers' Trainer pulls in accelerate, torch._dynamo and
# most of transformers: ~4 CPU s of every Trainer script). The client sends it the scripts that
# import transformers or accelerate (its FLAVOURS). It declines a program whose environment
# differs from its own in a variable these imports read (recorded while importing them) or
# whose sys.path finds another copy of a preloaded package; the plain server then runs it.
HF_PRELOAD = ("transformers.trainer",)
HF_PACKAGES = ("transformers", "accelerate", "huggingface_hub")
# read while importing only to size terminal output: the program's own value is in its
# environment from the start, so a difference does not send it to a fresh interpreter
# (``refusal`` compares these and USER_ENV apart from the other watched variables)
TERMINAL_ENV = ("COLUMNS", "LINES")
# read while importing through getpass.getuser() (torch's default inductor cache folder is named
# after the user), in this order, the password database's name when none is set: a program
# differs only if the name they resolve to does (an ssh login sets USER and LOGNAME, which the
# server's environment may not have, for the same user)
USER_ENV = ("LOGNAME", "USER", "LNAME", "USERNAME")
# variables the interpreter or a preloaded module reads while starting: a program whose value
# differs from the server's starts normally (prefix match, minus ALLOWED_ENV, which are read at
# use or applied to the fork). Other TORCH* variables (TORCHINDUCTOR_*, TORCH_EXTENSIONS_DIR,
# TORCHELASTIC_*, ...) are read when the feature is used, after the fork. TRITON_*: torch._dynamo
# imports triton, whose language module decides at import (reading its knobs later, unwatched)
# whether its @jit functions run under the interpreter (TRITON_INTERPRET).
IMPORT_TIME_ENV = ("PYTHON", "OMP_", "KMP_", "GOMP_", "MKL_", "LD_", "MALLOC", "TORCH_LOGS",
                   "TORCH_SHOW_CPP_STACKTRACES", "TORCH_CPP_LOG_LEVEL", "TORCH_USE_RTLD_GLOBAL",
                   "TORCH_DISABLE_ADDR2LINE", "PYTORCH_JIT", "TRITON_")
ALLOWED_ENV = ("PYTHONPATH", "PYTHONUNBUFFERED", "PYTHONDONTWRITEBYTECODE", "PYTHONIOENCODING",
               "OMP_NUM_THREADS", "MKL_NUM_THREADS")
_HIGH_FD = 1000  # received descriptors wait above this while they move to their numbers
_IMPORT_WRITES = {}  # environment variables the watched and flavoured preloads set or deleted


# ---------------------------------------------------------------- starting and stopping it --

def _start(path, preload, env, prefix=(), hf_preload=(), watched_preload=WATCHED_PRELOAD):
    server_env = {k: v for k, v in env.items() if k != ENV}
    flavoured = ["--hf", *hf_preload] if hf_preload else []
    return subprocess.Popen([*prefix, sys.executable, os.path.abspath(__file__), path, *preload,
                             "--watched", *watched_preload, *flavoured], env=server_env,
                            stdin=subprocess.DEVNULL)


def _hf_installed():
    import importlib.util

    return importlib.util.find_spec("transformers") is not None


def _stop(process):
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def start_server(preload=PRELOAD, env=None, hf_preload=None):
    """Start a server for this process's environment and network namespace and point ``env``
    (default os.environ) at it; with ``hf_preload`` (default HF_PRELOAD where transformers is
    installed) also its "hf" flavour. Returns a stop function. A socket appears once its
    preloads are imported; clients started before then start normally."""
    env = os.environ if env is None else env
    if hf_preload is None:
        hf_preload = HF_PRELOAD if _hf_installed() else ()
    folder = tempfile.mkdtemp(prefix="ds-warm-python-")
    path = _client.socket_path(folder)
    process = _start(path, preload, env, hf_preload=hf_preload)
    env[ENV] = folder
    env["PYTHONPATH"] = os.pathsep.join(p for p in (SITE_DIR, env.get("PYTHONPATH", "")) if p)

    def stop():
        if not os.path.isdir(folder):  # stopped already (explicitly, then at exit)
            return
        if env.get(ENV) == folder:
            del env[ENV]
            rest = pythonpath_without_site(env.get("PYTHONPATH", ""))
            if rest:
                env["PYTHONPATH"] = rest
            else:
                env.pop("PYTHONPATH", None)
        _stop(process)
        for name in os.listdir(folder):
            os.unlink(os.path.join(folder, name))
        os.rmdir(folder)

    atexit.register(stop)
    return stop


def start_node_server(netns, preload=PRELOAD, env=None):
    """Start a server inside the network namespace ``netns`` (``ip netns exec``: a fake node's
    own addresses and /etc files) next to the one ``env`` names, so programs started on that
    node run warm too. Returns a stop function; None when ``env`` names no server."""
    env = os.environ if env is None else env
    folder = env.get(ENV)
    if not folder:
        return None
    inode = os.stat(os.path.join("/run/netns", netns)).st_ino
    path = os.path.join(folder, f"net-{inode}.sock")
    process = _start(path, preload, env, prefix=("ip", "netns", "exec", netns))

    def stop():
        _stop(process)
        if os.path.exists(path):
            os.unlink(path)

    return stop


def pythonpath_without_site(pythonpath):
    """``pythonpath`` without the client's folder: what a fresh interpreter's environment holds."""
    return os.pathsep.join(p for p in pythonpath.split(os.pathsep) if p and p != SITE_DIR)


def detach(monkeypatch):
    """Programs started from now on (within ``monkeypatch``'s scope) get fresh interpreters."""
    monkeypatch.delenv(ENV, raising=False)
    rest = pythonpath_without_site(os.environ.get("PYTHONPATH", ""))
    if rest:
        monkeypatch.setenv("PYTHONPATH", rest)
    else:
        monkeypatch.delenv("PYTHONPATH", raising=False)


def wait_until_ready(env=None, timeout=60.0, flavour=""):
    """True once the server named in ``env`` (its ``flavour``) accepts programs (for tests of
    the server)."""
    folder = (os.environ if env is None else env).get(ENV)
    path = folder and _client.socket_path(folder, flavour)
    deadline = time.monotonic() + timeout
    while path and time.monotonic() < deadline:
        if os.path.exists(path):
            return True
        time.sleep(0.05)
    return False


# ------------------------------------------------------------------------------- the server --

def _die_with_parent():
    import ctypes

    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def _read_request(conn):
    data, fds, _flags, _addr = socket.recv_fds(conn, 1 << 16, 253)
    if len(data) < 8:
        raise ConnectionError("short request")
    size = int.from_bytes(data[:8], "big")
    body = bytearray(data[8:])
    while len(body) < size:
        chunk = conn.recv(size - len(body))
        if not chunk:
            raise ConnectionError("request cut short")
        body += chunk
    return json.loads(body), fds


def _import_time_env(key):
    # `PYTHON` alone is no interpreter variable (scripts name an interpreter with it)
    return key.startswith(IMPORT_TIME_ENV) and not key.startswith(ALLOWED_ENV) and key != "PYTHON"


def _program_path(request):
    """The program's sys.path, as ``_become`` sets it."""
    path = list(request["path"])
    if not request["safe_path"]:
        script = request["target"]
        path.insert(0, request["cwd"] if request["mode"] == "module"
                    else os.path.dirname(os.path.realpath(os.path.join(request["cwd"], script))))
    return path


def refusal(request, server_env, identity, watched=(), packages=None, written=None):
    """Why this server must not run the request (None when it can). ``watched``: variables its
    extra preloads read while importing, which must have the server's value or the value those
    imports ``written`` ({key: value}) set (a program started by one that imported them
    inherits that: torch's TORCHINDUCTOR_CACHE_DIR); ``packages``: {name: file} of the
    preloaded packages that the program's sys.path must find at the same place."""
    if request["executable"] != sys.executable and \
            os.path.realpath(request["executable"]) != os.path.realpath(sys.executable):
        return "another interpreter"
    if request["prefix"] != sys.prefix or request["version"] != sys.version:
        return "another environment"
    if request["identity"] != identity:
        return "another namespace or mount view"
    if request["warnoptions"] or request["xoptions"]:
        return "-W / -X options"
    if len(request["fds"]) != len(set(request["fds"])):
        return "descriptor list"
    client_env = request["env"]
    written = written or {}
    for key in set(client_env) | set(server_env):
        value = client_env.get(key)
        if _import_time_env(key) and value != server_env.get(key):
            return f"{key} differs"
        if key in watched and key not in TERMINAL_ENV + USER_ENV and \
                value != server_env.get(key) and (key not in written or value != written[key]):
            return f"{key} differs"
    if watched.intersection(USER_ENV) and _user_name(client_env) != _user_name(server_env):
        return "the user name (LOGNAME, USER, LNAME, USERNAME) differs"
    if packages:
        import importlib.machinery

        path = _program_path(request)
        for name, origin in packages.items():
            spec = importlib.machinery.PathFinder.find_spec(name, path)
            if spec is None or spec.origin != origin:
                return f"another {name}"
    return None


def _user_name(env):
    """The name getpass.getuser() returns in a process with ``env`` (and this process's uid)."""
    name = next((env[key] for key in USER_ENV if env.get(key)), None)
    if name is None:
        import pwd

        name = pwd.getpwuid(os.getuid()).pw_name
    return name


def _reap_supervisors(_signum, _frame):
    while True:
        try:
            pid, _status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


class _EnvironmentReads(collections.abc.MutableMapping):
    """``os.environ`` while the extra preloads import: notes every variable read, so the
    flavoured server can decline programs whose value differs (``iterated`` when a module read
    the whole environment, which leaves the variables it used unknown)."""

    def __init__(self, real):
        self.real, self.read, self.iterated = real, set(), False
        self.written = {}  # key -> value set, or None: deleted

    def __getitem__(self, key):
        self.read.add(key)
        return self.real[key]

    def __contains__(self, key):
        self.read.add(key)
        return key in self.real

    def get(self, key, default=None):
        self.read.add(key)
        return self.real.get(key, default)

    def __setitem__(self, key, value):
        self.real[key] = value
        self.written[key] = value

    def __delitem__(self, key):
        del self.real[key]
        self.written[key] = None

    def __iter__(self):
        self.iterated = True
        return iter(self.real)

    def __len__(self):
        return len(self.real)

    def copy(self):
        self.iterated = True
        return self.real.copy()


def _import_watching_environment(modules):
    """Import ``modules``; return the environment variables read meanwhile, those set (or
    deleted: None) meanwhile, and the files of the packages they belong to (and of
    the preloaded HF_PACKAGES; torch aside, which every server imports unwatched). Exits when a
    module read the whole environment."""
    real = os.environ
    reads = _EnvironmentReads(real)
    os.environ = reads
    try:
        for name in modules:
            __import__(name)
    finally:
        os.environ = real
    if reads.iterated:
        sys.stderr.write(f"warm python: importing {', '.join(modules)} read the whole "
                         "environment; no server\n")
        os._exit(0)
    names = {name.split(".")[0] for name in modules} - {"torch"}
    packages = {name: sys.modules[name].__spec__.origin for name in (*names, *HF_PACKAGES)
                if name in sys.modules}
    return frozenset(reads.read), reads.written, packages


def _end(flavoured):
    """SIGTERM: end the flavoured server first, so that no socket of it appears after this
    server's stop() emptied the folder."""
    if flavoured:
        try:
            os.kill(flavoured, signal.SIGKILL)
            os.waitpid(flavoured, 0)
        except (ProcessLookupError, ChildProcessError):
            flavoured = None  # it ended and was reaped already: nothing left to wait for
    os._exit(0)


def serve(path, preload=PRELOAD, hf_preload=(), watched_preload=WATCHED_PRELOAD):
    """The server's loop: preload (``watched_preload`` watching the environment), listen on
    ``path``, fork a supervisor per program. With ``hf_preload``, a fork of it (once the
    preloads are imported) imports those too and serves the "hf" flavour's socket next to
    ``path``."""
    global _IMPORT_WRITES
    _die_with_parent()
    for name in preload:
        __import__(name)
    server_env = dict(os.environ)  # as every program's interpreter starts, before any preload
    watched, _IMPORT_WRITES, packages = _import_watching_environment(watched_preload)
    flavoured = None
    if hf_preload:
        flavoured = os.fork()
        if flavoured == 0:
            _die_with_parent()
            flavoured = None
            path = path[:-len(".sock")] + ".hf.sock"
            hf_watched, hf_writes, hf_packages = _import_watching_environment(hf_preload)
            watched |= hf_watched
            _IMPORT_WRITES = {**_IMPORT_WRITES, **hf_writes}
            packages = {**packages, **hf_packages}
    # the preloaded heap lives as long as every program forked from here: frozen, a program's
    # full collections skip it, and no longer copy each page they would have touched
    gc.collect()
    gc.freeze()
    identity = _client.identity()
    # DS_WARM_PYTHON_LOG: one JSON line per program (mode, target, why it started fresh or null)
    log_path = os.environ.get(LOG_ENV)
    log = open(log_path, "a", encoding="utf-8") if log_path else None
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    temporary = path + ".new"
    listener.bind(temporary)
    listener.listen(128)
    os.rename(temporary, path)  # clients see the socket only once it accepts
    # reaping the supervisors (rather than SIG_IGN) keeps their CPU time in this process's
    # children times, so `time pytest` still counts every program's CPU
    signal.signal(signal.SIGCHLD, _reap_supervisors)
    signal.signal(signal.SIGTERM, lambda *_: _end(flavoured))
    while True:
        conn, _ = listener.accept()
        fds = []
        try:
            request, fds = _read_request(conn)
            reason = refusal(request, server_env, identity, watched, packages, _IMPORT_WRITES)
            if log is not None:
                log.write(json.dumps([request["mode"], request["target"], reason]) + "\n")
                log.flush()
            if reason is not None:
                conn.sendall(json.dumps({"fallback": reason}).encode() + b"\n")
            elif os.fork() == 0:
                listener.close()
                _supervise(conn, request, fds)  # never returns
        except (OSError, ValueError, KeyError) as error:
            sys.stderr.write(f"warm python server: dropped a request ({error!r})\n")
        finally:
            conn.close()
            for fd in fds:
                os.close(fd)


# --------------------------------------------------------------------------- the supervisor --

def _supervise(conn, request, fds):
    """Start the program, report its pid and its end; kill its group if the client dies."""
    code = 70
    try:
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        pid = os.fork()
        if pid == 0:
            _run_program(conn, request, fds)  # never returns
        for fd in fds:
            os.close(fd)
        fds.clear()
        watch = os.pidfd_open(pid)
        conn.sendall(json.dumps({"pid": pid}).encode() + b"\n")
        while True:
            ready, _, _ = select.select([conn, watch], [], [])
            if watch in ready:
                break
            if not conn.recv(1):  # the client died: so does the program, with its group
                os.killpg(pid, signal.SIGKILL)
                break
        _, status = os.waitpid(pid, 0)
        if os.WIFSIGNALED(status):
            report = {"signal": os.WTERMSIG(status)}
        else:
            report = {"exit": os.waitstatus_to_exitcode(status)}
        try:
            conn.sendall(json.dumps(report).encode() + b"\n")
        except OSError:  # the client is gone; nobody is left to tell
            code = 0
        else:
            code = 0
    finally:
        os._exit(code)


# ------------------------------------------------------------------------------ the program --

def _install_fds(fds, targets, keep):
    """Put received descriptor ``fds[i]`` at number ``targets[i]``; close all others but
    ``keep``."""
    import fcntl

    parked = [fcntl.fcntl(fd, fcntl.F_DUPFD, _HIGH_FD) for fd in fds]
    for fd in fds:
        os.close(fd)
    for fd, target in zip(parked, targets):
        os.dup2(fd, target)
    wanted = set(targets) | set(keep)
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        if fd not in wanted:
            try:
                os.close(fd)
            except OSError:  # the listing's own descriptor, already closed
                continue


def _stdio(fd, setup, write, unbuffered, targets):
    if fd not in targets or setup is None:
        return None
    encoding, errors = setup
    raw = io.FileIO(fd, "wb" if write else "rb", closefd=False)
    if not write:
        return io.TextIOWrapper(io.BufferedReader(raw), encoding, errors, newline=None)
    buffer = raw if unbuffered else io.BufferedWriter(raw)
    line_buffering = fd == 2 or raw.isatty()
    return io.TextIOWrapper(buffer, encoding, errors, newline="\n",
                            line_buffering=line_buffering, write_through=unbuffered)


def _repoint_log_handlers(moved):
    """Log handlers a preloaded module made (transformers' writes to the stderr of its import)
    write to the program's streams, as they would had the program imported that module."""
    if "logging" not in sys.modules:
        return
    import logging

    loggers = [logging.getLogger()] + [logger for logger in logging.Logger.manager.loggerDict.values()
                                       if isinstance(logger, logging.Logger)]
    for logger in loggers:
        for handler in logger.handlers:
            for old, new in moved:
                if isinstance(handler, logging.StreamHandler) and handler.stream is old \
                        and new is not None:
                    handler.stream = new


def _become(request, fds):
    """Turn this fork into the client's process image, short of exec."""
    os.setsid()
    for signum in (signal.SIGCHLD, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT,
                   signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(signum, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)  # as Python sets it at start-up
    targets = request["fds"]
    _install_fds(fds, targets, keep=())
    os.chdir(request["cwd"])
    os.umask(request["umask"])
    os.sched_setaffinity(0, request["affinity"])
    if request["nice"] > os.getpriority(os.PRIO_PROCESS, 0):
        os.setpriority(os.PRIO_PROCESS, 0, request["nice"])
    os.environ.clear()
    os.environ.update(request["env"])
    for key, value in _IMPORT_WRITES.items():  # what the preloads' imports set, as if just run
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
    sys.argv[:] = request["argv"]
    sys.orig_argv = request["orig_argv"]
    sys.executable = request["executable"]
    sys.dont_write_bytecode = request["dont_write_bytecode"]
    sys.path[:] = _program_path(request)
    unbuffered = request["unbuffered"]
    stdin, stdout, stderr = request["stdio"]
    streams = sys.stdout, sys.stderr
    sys.stdin = sys.__stdin__ = _stdio(0, stdin, False, unbuffered, targets)
    sys.stdout = sys.__stdout__ = _stdio(1, stdout, True, unbuffered, targets)
    sys.stderr = sys.__stderr__ = _stdio(2, stderr, True, unbuffered, targets)
    _repoint_log_handlers(list(zip(streams, (sys.stdout, sys.stderr))))
    if "torch" in sys.modules:
        threads = os.environ.get("OMP_NUM_THREADS") or os.environ.get("MKL_NUM_THREADS")
        if threads and threads.isdigit() and int(threads) > 0:
            sys.modules["torch"].set_num_threads(int(threads))
    if "numpy" in sys.modules:  # a fresh interpreter seeds numpy's global generator afresh
        sys.modules["numpy"].random.seed()
    import importlib

    importlib.invalidate_caches()


def _run_main(request):
    import runpy

    main = types.ModuleType("__main__")
    sys.modules["__main__"] = main
    if request["mode"] == "module":
        runpy._run_module_as_main(request["target"], alter_argv=True)
        return
    script = os.path.abspath(request["target"])
    with io.open_code(script) as handle:
        source = handle.read()
    main.__dict__.update(__file__=script, __cached__=None, __builtins__=__builtins__)
    exec(compile(source, script, "exec", dont_inherit=True), main.__dict__)


def _program_frames(traceback):
    """``traceback`` without this file's frames: the program's traceback as a fresh
    interpreter prints it."""
    here = os.path.abspath(__file__)
    while traceback is not None and traceback.tb_frame.f_code.co_filename == here:
        traceback = traceback.tb_next
    return traceback


def _exit_code(error):
    if error.code is None:
        return 0
    if isinstance(error.code, int):
        return error.code
    print(error.code, file=sys.stderr)
    return 1


def _finish(code):
    """Python's own shutdown, short of finalising the interpreter: threads, atexit, flush."""
    import atexit as _atexit
    import threading

    threading._shutdown()
    _atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        if stream is None:
            continue
        try:
            stream.flush()
        except (OSError, ValueError):
            code = 120  # Python's status when flushing stdout fails at exit
    os._exit(code)


def _run_program(conn, request, fds):
    code = 70
    try:
        conn.close()
        try:
            _become(request, fds)
        except BaseException:
            import traceback

            sys.__stderr__.write("warm python: could not set up the program's process\n")
            traceback.print_exc(file=sys.__stderr__)
            raise
        code = 1
        try:
            _run_main(request)
            code = 0
        except SystemExit as error:
            code = _exit_code(error)
        except KeyboardInterrupt:
            import traceback

            traceback.print_exc()
            sys.stderr.flush()
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGINT)
        except BaseException as error:
            frames = _program_frames(error.__traceback__)  # the hook prints the error's own
            sys.excepthook(type(error), error.with_traceback(frames), frames)
            code = 1
        _finish(code)
    finally:
        os._exit(code)


if __name__ == "__main__":
    # this folder holds modules named like packages (triton.py): not on the preloads' path
    _here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _here]
    _args = sys.argv[2:]
    _hf = _args.index("--hf") if "--hf" in _args else len(_args)
    _watched = _args.index("--watched") if "--watched" in _args[:_hf] else _hf
    serve(sys.argv[1], tuple(_args[:_watched]), tuple(_args[_hf + 1:]),
          tuple(_args[_watched + 1:_hf]))
