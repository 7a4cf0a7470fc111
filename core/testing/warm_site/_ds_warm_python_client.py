"""The warm Python client (see ``deepspeed.testing.warm_python``): ``hand_over()`` sends this
interpreter's program to the server for its namespaces, or returns to let it start normally.
Run by ``sitecustomize`` in this folder at every interpreter start-up; imported by the server
for ``identity()``, so both sides describe a process the same way. Standard library only.
"""
import os
import sys

ENV = "DS_WARM_PYTHON"
_FLAGS_ALLOWED = set("uBsEP")


def _program(args):
    """``("script", path, flags)`` / ``("module", name, flags)`` for what this interpreter was
    asked to run, or None when it is anything the server does not reproduce."""
    flags = set()
    index = 0
    while index < len(args):
        arg = args[index]
        if arg == "--":
            index += 1
            break
        if not arg.startswith("-") or arg == "-":
            break
        if arg.startswith("-m"):
            name = arg[2:] or (args[index + 1] if index + 1 < len(args) else "")
            return ("module", name, flags) if name else None
        letters = set(arg[1:])
        if not letters <= _FLAGS_ALLOWED:
            return None  # -c, -i, -O, -W, -X, -I, -S, ...
        flags |= letters
        index += 1
    if index >= len(args) or args[index] == "-":
        return None  # interactive or stdin
    script = args[index]
    if not os.path.isfile(script) or script.endswith((".pyc", ".pyz", ".zip")):
        return None
    return ("script", script, flags)


def _open_fds(skip):
    fds = []
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        if fd == skip:
            continue
        try:
            os.fstat(fd)
        except OSError:  # the directory listing's own descriptor, closed by now
            continue
        fds.append(fd)
    return sorted(fds)


def _file_id(path):
    try:
        info = os.stat(path)
    except OSError:
        return None
    return [info.st_dev, info.st_ino]


def identity():
    """What a fork of the server must share with this process to behave as it would: its
    namespaces, and the files a node's mount namespace swaps in (``ip netns exec`` bind-mounts
    ``/etc/netns/<name>/*``; a mount namespace's own inode differs between two ``exec``s into the
    same node, so the view is compared instead)."""
    found = {kind: _file_id(f"/proc/self/ns/{kind}") for kind in ("net", "pid", "user", "ipc", "uts")}
    found["view"] = [_file_id(p) for p in ("/", "/etc/hosts", "/etc/resolv.conf")]
    return found


def socket_path(folder, flavour=""):
    """The socket of the server for this process's network namespace under ``folder``; with a
    ``flavour``, that of its second server, which has also imported the flavour's packages."""
    net = _file_id("/proc/self/ns/net")
    return os.path.join(folder, f"net-{net[1] if net else 0}{'.' + flavour if flavour else ''}.sock")


# flavour -> the packages that send a program to it: a script that imports transformers or
# accelerate (or a module of theirs run with -m) goes first to the server that has imported them
# (~4 CPU s less per program), then, if that server declines, to the plain one. Only routing:
# either server runs any program.
FLAVOURS = {"hf": ("transformers", "accelerate")}


def _flavours(program):
    """The servers to ask for ``program``, in order (``""`` is the plain one)."""
    mode, target, _flags = program
    wanted = []
    text = b""
    if mode != "module":
        try:
            with open(target, "rb") as handle:
                text = handle.read(1 << 20)
        except OSError:  # unreadable: the plain server decides
            pass
    for flavour, packages in FLAVOURS.items():
        if mode == "module":
            found = target.split(".")[0] in packages
        else:
            found = any(f"{word} {package}".encode() in text
                        for package in packages for word in ("import", "from"))
        if found:
            wanted.append(flavour)
    return wanted + [""]


def _stream_setup(stream):
    return None if stream is None else [stream.encoding, stream.errors]


def _request(program, fds):
    mode, target, flags = program
    unbuffered = "u" in flags or bool(os.environ.get("PYTHONUNBUFFERED")) and "E" not in flags
    umask = os.umask(0)
    os.umask(umask)
    return {
        "mode": mode, "target": target, "argv": list(sys.argv), "orig_argv": list(sys.orig_argv),
        "cwd": os.getcwd(), "env": dict(os.environ), "path": list(sys.path),
        "executable": sys.executable, "prefix": sys.prefix, "version": sys.version,
        "identity": identity(), "fds": fds, "unbuffered": unbuffered,
        "dont_write_bytecode": sys.dont_write_bytecode, "safe_path": sys.flags.safe_path,
        "warnoptions": list(sys.warnoptions), "xoptions": dict(sys._xoptions),
        "stdio": [_stream_setup(sys.stdin), _stream_setup(sys.stdout), _stream_setup(sys.stderr)],
        "umask": umask, "nice": os.getpriority(os.PRIO_PROCESS, 0),
        "affinity": sorted(os.sched_getaffinity(0)),
    }


def _relay(conn, reader):
    """Forward signals to the forked program and end this process the way it ended."""
    import json
    import signal

    first = json.loads(reader.readline() or b"null")
    if not first or "fallback" in first:
        return False
    pid = first["pid"]

    def forward(signum, _frame):
        try:
            os.kill(pid, signum)
        except ProcessLookupError:  # it ended between the signal and this handler
            return

    try:  # the program runs now: from here on this process must never start it a second time
        for name in ("SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2", "SIGWINCH"):
            signal.signal(getattr(signal, name), forward)
        line = reader.readline()
        if not line:
            raise ConnectionError("the server's supervisor closed the connection")
        status = json.loads(line)
        if "signal" in status:
            signal.signal(status["signal"], signal.SIG_DFL)
            os.kill(os.getpid(), status["signal"])
        os._exit(status["exit"])
    except BaseException as error:
        sys.stderr.write(f"warm python: lost program pid {pid} ({type(error).__name__}: {error})\n")
        os._exit(70)


def hand_over():
    folder = os.environ.get(ENV)
    if not folder or not hasattr(sys, "orig_argv"):
        return
    if not os.path.exists(socket_path(folder)):
        return
    program = _program(sys.orig_argv[1:])
    if program is None:
        return
    import json
    import socket

    for flavour in _flavours(program):
        path = socket_path(folder, flavour)
        if not os.path.exists(path):
            continue
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            conn.connect(path)
        except OSError:  # the server is gone or not ready: ask the next, or start normally
            conn.close()
            continue
        fds = _open_fds(conn.fileno())
        data = json.dumps(_request(program, fds)).encode()
        payload = len(data).to_bytes(8, "big") + data
        sent = socket.send_fds(conn, [payload], fds)
        if sent < len(payload):
            conn.sendall(payload[sent:])
        reader = conn.makefile("rb")
        _relay(conn, reader)  # returns only when this server declined the program
        reader.close()
        conn.close()
