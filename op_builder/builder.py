"""Base classes that turn a list of C++/CUDA sources into an importable torch extension.

An op is built one of two ways: ahead of time by `setup.py` when a `DS_BUILD_*` variable is set
(the module is then importable as `absolute_name()`), or just in time on first `load()` through
`torch.utils.cpp_extension.load`, which caches under `TORCH_EXTENSIONS_DIR`. Either way the caller
only sees `load()`, and an op that cannot be built says why in `incompatible_reason` (shown by
ds_report) instead of failing deep inside a compiler.
"""
from __future__ import annotations

import contextlib
import functools
import importlib
import importlib.util
import os
import platform
import re
import shutil
import subprocess
import sys
from pathlib import Path

# In a source/editable install this file is <repo>/op_builder/builder.py and the sources are
# <repo>/csrc; in a wheel it is deepspeed/ops/op_builder/builder.py and setup.py ships the sources
# as deepspeed/ops/csrc. Both are "two levels up, then csrc".
CSRC_ROOT = Path(__file__).resolve().parent.parent / "csrc"

_LOG_TAIL_LINES = 40


# next to a JIT build: the hash of what it was built from (``OpBuilder._source_stamp``)
STAMP_FILENAME = "ds_source_stamp"


def _path_in_tree(path):
    """``path`` relative to ``CSRC_ROOT`` when it lies inside, else as given."""
    try:
        return Path(path).resolve().relative_to(CSRC_ROOT).as_posix()
    except ValueError:
        return str(path)


def _read_owner(path):
    """The pid recorded in a ``lock.owner`` file, or None."""
    try:
        with open(path) as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return None


def _process_alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class OpBuildError(RuntimeError):
    """A native op could not be built or loaded; the message names the op and why."""


def _cpu_flag_set():
    """The CPU feature flags: /proc/cpuinfo where the kernel offers it (read in microseconds),
    else py-cpuinfo, which starts a Python subprocess per call (a second of wall time and
    ~0.4 CPU s in every process that loads an op: each rank of every job)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        text = ""
    match = re.search(r"^(?:flags|Features)\s*:\s*(.*)$", text, re.MULTILINE)
    if match and match.group(1).split():
        return set(match.group(1).split())
    try:
        import cpuinfo

        return set(cpuinfo.get_cpu_info().get("flags", []))
    except Exception as exc:  # py-cpuinfo shells out and can fail in sandboxes
        from deepspeed.utils.logging import logger

        logger.debug("py-cpuinfo failed (%r): no CPU flags known", exc)
        return set()


@functools.lru_cache(maxsize=None)
def cpu_simd_flags():
    """Compiler flags for the widest SIMD this CPU runs; vectorised kernels key off them.

    The flags are for the build machine: an AOT wheel moved to an older CPU would fault, which is
    why JIT builds (compiled where they run) are the default.
    """
    machine = platform.machine().lower()
    if machine not in ("x86_64", "amd64", "i686", "i386"):
        return []  # aarch64 has NEON by default; other architectures get the compiler's default
    flags = _cpu_flag_set()
    if {"avx512f", "avx512bw", "avx512vl"} <= flags:
        return ["-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx2", "-mfma", "-mf16c"]
    if {"avx2", "fma"} <= flags:
        return ["-mavx2", "-mfma"] + (["-mf16c"] if "f16c" in flags else [])
    if "avx" in flags:
        return ["-mavx"]
    return []


def _which_cxx():
    """The C++ compiler torch will invoke (CXX or c++), as a path, or None."""
    compiler = os.environ.get("CXX", "c++")
    return shutil.which(compiler.split()[0]) if compiler.strip() else None


def _pinned_ninja_dir():
    """The directory of the ninja that JIT builds must use: the one pip installed with this
    package (the ``ninja`` distribution, a dependency), else None (whatever ninja PATH finds).

    ninja records a hash of each command in the build directory's ``.ninja_log``, and ninja 1.12
    changed that hash. With two ninjas on a machine (the virtual environment's and the system's),
    which one torch runs depends on PATH: a process started as ``.venv/bin/python`` (no
    activation) gets the system one, a launched rank whose PATH starts with ``.venv/bin`` gets the
    other, and each then sees every object as built by a different command and recompiles the
    whole op (async_io: about 100 CPU s) every time the two alternate."""
    try:
        import ninja
    except ImportError:
        return None
    directory = getattr(ninja, "BIN_DIR", None)
    if directory and os.path.isfile(os.path.join(directory, "ninja")):
        return directory
    return None


@contextlib.contextmanager
def _ninja_first_on_path():
    """PATH with the pinned ninja's directory first, for the duration of one build (torch runs
    ``ninja`` by name through the process environment)."""
    directory = _pinned_ninja_dir()
    before = os.environ.get("PATH")
    if directory is None or (before or "").split(os.pathsep)[0] == directory:
        yield
        return
    os.environ["PATH"] = os.pathsep.join(p for p in (directory, before) if p)
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("PATH", None)
        else:
            os.environ["PATH"] = before


def compiler_version(command):
    """First line of `<command> --version`, or None when it cannot be run."""
    exe = shutil.which(command)
    if exe is None:
        return None
    try:
        out = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    lines = [line for line in (out.stdout or "").splitlines() if line.strip()]
    if out.returncode != 0 or not lines:
        return None
    return lines[-1] if "nvcc" in command else lines[0]


def _setup_relative(paths):
    """setuptools refuses absolute source paths; setup.py runs from the repo root, so sources
    under the working directory are given relative to it."""
    cwd = os.getcwd()
    return [os.path.relpath(p, cwd) if os.path.commonpath([cwd, os.path.abspath(p)]) == cwd else p
            for p in paths]


def _tail(text, lines=_LOG_TAIL_LINES):
    return "\n".join(str(text).rstrip().splitlines()[-lines:])


class OpBuilder:
    """One C++ op. Subclasses set NAME and override sources() (and flags where needed)."""

    NAME: str = ""
    # absolute_name() -> loaded module, shared by all instances so a process builds/imports once
    _loaded_modules: dict = {}

    def __init__(self):
        if not self.NAME or not self.NAME.isidentifier():
            raise ValueError(f"{type(self).__name__}.NAME must be a non-empty identifier "
                             f"(it names the extension module), got {self.NAME!r}")
        self.incompatible_reason = ""

    # ------------------------------------------------------------------ description
    @property
    def BUILD_VAR(self):
        return "DS_BUILD_" + self.NAME.upper()

    def absolute_name(self):
        """Import name of the AOT-built module; subclasses place it next to their Python op."""
        return f"deepspeed.ops.{self.NAME}_op"

    def sources(self):
        raise NotImplementedError(f"{type(self).__name__} must list its sources (relative to CSRC_ROOT)")

    def include_paths(self):
        return []

    def cxx_args(self):
        return ["-O3", "-std=c++17", "-fopenmp", "-g0", *cpu_simd_flags()]

    def extra_ldflags(self):
        return ["-fopenmp"]

    # ------------------------------------------------------------------ paths
    @staticmethod
    def _abs(path):
        path = Path(path)
        return str(path if path.is_absolute() else CSRC_ROOT / path)

    def absolute_sources(self):
        return [self._abs(s) for s in self.sources()]

    def absolute_include_paths(self):
        return [self._abs(p) for p in self.include_paths()]

    # ------------------------------------------------------------------ checks
    def is_compatible(self, verbose=False):
        """Whether this machine can JIT-build the op; sets `incompatible_reason` when not."""
        reasons = []
        if _which_cxx() is None:
            reasons.append(f"no C++ compiler: {os.environ.get('CXX', 'c++')!r} is not on PATH "
                           "(install g++ or set CXX)")
        missing = [s for s in self.absolute_sources() if not os.path.isfile(s)]
        if missing:
            reasons.append(f"source files missing: {', '.join(missing)}")
        self.incompatible_reason = "; ".join(reasons)
        if reasons and verbose:
            from deepspeed.utils.logging import logger

            logger.warning("%s is not compatible: %s", self.NAME, self.incompatible_reason)
        return not reasons

    def is_installed(self):
        """Whether an ahead-of-time build of the op is importable."""
        try:
            return importlib.util.find_spec(self.absolute_name()) is not None
        except (ImportError, ValueError):
            return False

    # ------------------------------------------------------------------ loading
    def load(self, verbose=True):
        """The op module: the AOT build when installed, else a JIT build."""
        cached = self._loaded_modules.get(self.absolute_name())
        if cached is not None:
            return cached
        if self.is_installed():
            module = importlib.import_module(self.absolute_name())
            self._loaded_modules[self.absolute_name()] = module
            return module
        return self.jit_load(verbose=verbose)

    def _jit_kwargs(self):
        return dict(extra_cflags=self.cxx_args(), extra_ldflags=self.extra_ldflags())

    def build_directory(self, cpp_extension, stamp):
        """Where this op is JIT-built. Under torch's default root the folder is named by what is
        built (``deepspeed/<op>-<stamp>``, the content hash of ``_source_stamp``): two
        checkouts or virtual environments with different sources never rebuild each other's
        op or wait on each other's lock, and a fresh clone of the same sources finds the build
        it already made. An explicit ``TORCH_EXTENSIONS_DIR`` is used as is (``<dir>/<op>``,
        rebuilt in place when the sources change)."""
        default = cpp_extension._get_build_directory(self.NAME, verbose=False)
        if os.environ.get("TORCH_EXTENSIONS_DIR"):
            return default
        path = os.path.join(os.path.dirname(default), "deepspeed", f"{self.NAME}-{stamp[:16]}")
        os.makedirs(path, exist_ok=True)
        return path

    def _clear_stale_build_lock(self, build_dir):
        """torch waits forever on a build directory's ``lock`` file, and a build killed
        mid-way (SIGKILL, OOM, a test timeout) leaves one behind. We record the building
        process in ``lock.owner``: a lock whose owner is gone is removed at once; a lock
        without a recorded owner only when older than ``DS_BUILD_LOCK_STALE_S`` seconds
        (default 900; a build takes about a minute)."""
        import time

        lock = os.path.join(build_dir, "lock")
        try:
            age = time.time() - os.path.getmtime(lock)
        except OSError:
            return  # no lock: nobody is building
        owner = _read_owner(lock + ".owner")
        if owner is not None:
            stale, why = not _process_alive(owner), f"its builder (pid {owner}) is gone"
        else:
            stale = age > float(os.environ.get("DS_BUILD_LOCK_STALE_S", "900"))
            why = f"{age:.0f} s old; set DS_BUILD_LOCK_STALE_S to change the limit"
        if stale:
            from deepspeed.utils.logging import logger

            logger.warning(f"removing stale build lock '{lock}' of op '{self.NAME}' ({why}; a "
                           f"build killed mid-way leaves one)")
            for leftover in (lock, lock + ".owner"):
                try:
                    os.remove(leftover)
                except FileNotFoundError:
                    pass

    def jit_load(self, verbose=True):
        """Compile (or reuse torch's cached build under TORCH_EXTENSIONS_DIR) and import the op."""
        cached = self._loaded_modules.get(self.absolute_name())
        if cached is not None:
            return cached
        if not self.is_compatible(verbose=verbose):
            raise OpBuildError(f"op '{self.NAME}' cannot be built on this machine: {self.incompatible_reason}")
        try:
            from torch.utils import cpp_extension
        except ImportError as err:
            raise OpBuildError(f"op '{self.NAME}' needs torch to build: {err}") from err
        try:
            cpp_extension.verify_ninja_availability()
        except RuntimeError as err:
            raise OpBuildError(f"op '{self.NAME}' cannot be JIT-built: ninja is missing "
                               f"(pip install ninja): {err}") from err
        sources = self.absolute_sources()
        kwargs = self._jit_kwargs()
        stamp = self._source_stamp(sources, kwargs)
        build_dir = self.build_directory(cpp_extension, stamp)
        module = self._load_stamped_build(cpp_extension, build_dir, stamp)
        if module is not None:
            self._loaded_modules[self.absolute_name()] = module
            return module
        self._clear_stale_build_lock(build_dir)
        owner = os.path.join(build_dir, "lock.owner")
        try:
            if not os.path.exists(os.path.join(build_dir, "lock")):  # we are about to take it
                with open(owner, "w") as f:
                    f.write(str(os.getpid()))
            with _ninja_first_on_path():
                module = cpp_extension.load(name=self.NAME, sources=sources,
                                            extra_include_paths=self.absolute_include_paths(),
                                            build_directory=build_dir, verbose=verbose, **kwargs)
        except (RuntimeError, OSError, subprocess.SubprocessError) as err:
            flags = " ".join(kwargs.get("extra_cflags", []))
            raise OpBuildError(
                f"op '{self.NAME}' failed to build (sources: {', '.join(sources)}; "
                f"compiler: {os.environ.get('CXX', 'c++')} {flags}; build dir: {build_dir}).\n"
                f"Compiler output (tail):\n{_tail(err)}") from err
        finally:
            if _read_owner(owner) == os.getpid():
                os.remove(owner)
        from deepspeed.checkpoint.atomic import atomic_write_text  # runtime only, not setup.py

        atomic_write_text(os.path.join(build_dir, STAMP_FILENAME), stamp)
        self._loaded_modules[self.absolute_name()] = module
        return module

    def _source_stamp(self, sources, kwargs):
        """A hash of what the build reads (sources, the headers under the include paths, flags,
        torch and Python versions), not of file times, nor of where the checkout is: files
        under ``CSRC_ROOT`` count by their path inside it."""
        import hashlib

        import torch

        digest = hashlib.sha256(repr((sorted(kwargs.items()), torch.__version__, sys.version,
                                      os.environ.get("CXX", ""))).encode())
        headers = sorted(str(p) for d in self.absolute_include_paths() if os.path.isdir(d)
                         for p in Path(d).rglob("*") if p.is_file())
        for path in list(sources) + headers:
            digest.update(_path_in_tree(path).encode())
            with open(path, "rb") as handle:
                digest.update(handle.read())
        return digest.hexdigest()

    def _load_stamped_build(self, cpp_extension, build_dir, stamp):
        """The built op when its stamp matches, without asking ninja: a fresh clone's sources
        are newer than the objects, so ninja would recompile identical sources."""
        library = os.path.join(build_dir, f"{self.NAME}.so")
        try:
            with open(os.path.join(build_dir, STAMP_FILENAME), encoding="ascii") as handle:
                recorded = handle.read().strip()
        except OSError:  # never built here, or built before stamps existed
            return None
        if recorded != stamp or not os.path.exists(library) or \
                os.path.exists(os.path.join(build_dir, "lock")):
            return None
        return cpp_extension._import_module_from_library(self.NAME, build_dir, True)

    def builder(self):
        """The setuptools extension for an ahead-of-time (DS_BUILD_*) build."""
        from torch.utils.cpp_extension import CppExtension

        return CppExtension(name=self.absolute_name(), sources=_setup_relative(self.absolute_sources()),
                            include_dirs=self.absolute_include_paths(),
                            extra_compile_args={"cxx": self.cxx_args()},
                            extra_link_args=self.extra_ldflags())


def _nvcc_path():
    """nvcc from CUDA_HOME / torch's idea of it / PATH, or None."""
    candidates = []
    for var in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(var):
            candidates.append(os.path.join(os.environ[var], "bin", "nvcc"))
    candidates.append(shutil.which("nvcc"))
    return next((c for c in candidates if c and os.path.isfile(c) and os.access(c, os.X_OK)), None)


def nvcc_version(nvcc=None):
    """(major, minor) of nvcc, or None."""
    nvcc = nvcc or _nvcc_path()
    if nvcc is None:
        return None
    try:
        out = subprocess.run([nvcc, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    match = re.search(r"release (\d+)\.(\d+)", out or "")
    return (int(match.group(1)), int(match.group(2))) if match else None


class CUDAOpBuilder(OpBuilder):
    """One CUDA op: needs a CUDA build of torch and a matching nvcc."""

    def nvcc_args(self):
        return ["-O3", "--use_fast_math", "-std=c++17", "-U__CUDA_NO_HALF_OPERATORS__",
                "-U__CUDA_NO_HALF_CONVERSIONS__", "-U__CUDA_NO_HALF2_OPERATORS__"]

    def cxx_args(self):
        return ["-O3", "-std=c++17", "-g0"]

    def extra_ldflags(self):
        return []

    def _cuda_reasons(self):
        try:
            import torch
        except ImportError:
            return ["torch is not installed"]
        if torch.version.cuda is None:
            return [f"torch {torch.__version__} was built without CUDA (a CUDA build of torch is needed)"]
        nvcc = _nvcc_path()
        if nvcc is None:
            return ["nvcc was not found (set CUDA_HOME or put nvcc on PATH)"]
        if os.environ.get("DS_SKIP_CUDA_CHECK", "0") == "1":
            return []
        installed = nvcc_version(nvcc)
        torch_major, torch_minor = (int(x) for x in torch.version.cuda.split(".")[:2])
        if installed is None:
            return [f"could not read the version of {nvcc}"]
        if installed[0] != torch_major:
            return [f"Installed CUDA version {installed[0]}.{installed[1]} does not match the version "
                    f"torch was compiled with {torch_major}.{torch_minor} (set DS_SKIP_CUDA_CHECK=1 "
                    "to try anyway)"]
        if installed[1] != torch_minor:
            from deepspeed.utils.logging import logger

            logger.warning("%s: CUDA minor version mismatch (nvcc %d.%d, torch %d.%d); usually fine",
                           self.NAME, installed[0], installed[1], torch_major, torch_minor)
        return []

    def is_compatible(self, verbose=False):
        base_ok = super().is_compatible(verbose=False)
        reasons = ([self.incompatible_reason] if not base_ok else []) + self._cuda_reasons()
        self.incompatible_reason = "; ".join(reasons)
        if reasons and verbose:
            from deepspeed.utils.logging import logger

            logger.warning("%s is not compatible: %s", self.NAME, self.incompatible_reason)
        return not reasons

    def _jit_kwargs(self):
        # torch reads TORCH_CUDA_ARCH_LIST itself (or targets the visible GPUs when it is unset)
        return dict(extra_cflags=self.cxx_args(), extra_cuda_cflags=self.nvcc_args(),
                    extra_ldflags=self.extra_ldflags())

    def builder(self):
        from torch.utils.cpp_extension import CUDAExtension

        try:
            return CUDAExtension(name=self.absolute_name(),
                                 sources=_setup_relative(self.absolute_sources()),
                                 include_dirs=self.absolute_include_paths(),
                                 extra_compile_args={"cxx": self.cxx_args(), "nvcc": self.nvcc_args()},
                                 extra_link_args=self.extra_ldflags())
        except OSError as err:  # torch raises OSError when it cannot locate the CUDA toolkit
            raise OpBuildError(f"op '{self.NAME}' cannot be pre-built: {err}") from err


def get_op_builder(name_or_class_name):
    """The builder class for an op name ('cpu_adam') or class name ('CPUAdamBuilder'), or None.

    Resolution goes through the current accelerator so an installed vendor package's
    `deepspeed.op_builders` entry point overrides the built-in class.
    """
    from deepspeed.accelerator import get_accelerator, installed_op_builders

    if not isinstance(name_or_class_name, str) or not name_or_class_name:
        raise ValueError(f"op builder name must be a non-empty string, got {name_or_class_name!r}")
    accelerator = get_accelerator()
    if name_or_class_name.isidentifier() and name_or_class_name[0].isupper():
        return accelerator.get_op_builder(name_or_class_name)
    for class_name in installed_op_builders():
        builder_class = accelerator.get_op_builder(class_name)
        if builder_class is not None and getattr(builder_class, "NAME", None) == name_or_class_name:
            return builder_class
    return None
