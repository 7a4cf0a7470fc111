"""Builder of the `async_io` op (DeepNVMe `aio_handle`).

The op always builds on Linux: with libaio (kernel async I/O, `queue_depth` requests in flight
per thread) when `libaio.h` and `-laio` link, else with a pool of threads doing pread/pwrite.
The probe runs once per process; `backend()` on the loaded module says which one was compiled.
Set DS_AIO_NO_LIBAIO=1 to force the thread-pool engine (e.g. to compare the two).
"""
from __future__ import annotations

import functools
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from .builder import OpBuilder, _which_cxx

_PROBE = r"""
#include <libaio.h>
int main() { io_context_t ctx = 0; if (io_setup(1, &ctx) == 0) io_destroy(ctx); return 0; }
"""


@functools.lru_cache(maxsize=None)
def libaio_link_error(cxx):
    """'' when a program using libaio compiles and links with `cxx`, else why not."""
    with tempfile.TemporaryDirectory(prefix="ds_aio_probe_") as tmp:
        src = Path(tmp) / "probe.cpp"
        src.write_text(_PROBE)
        cmd = [cxx, str(src), "-o", str(Path(tmp) / "probe"), *_flag_env("CFLAGS"),
               *_flag_env("LDFLAGS"), "-laio"]
        try:
            out = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
        except (OSError, subprocess.SubprocessError) as err:
            return f"could not run {cxx}: {err}"
        if out.returncode != 0:
            lines = (out.stderr or out.stdout).strip().splitlines()
            return lines[-1] if lines else f"{cxx} exited with {out.returncode}"
    return ""


def _flag_env(var):
    return os.environ.get(var, "").split()


class AsyncIOBuilder(OpBuilder):
    NAME = "async_io"
    BUILD_VAR = "DS_BUILD_AIO"  # the install docs' name, not DS_BUILD_ASYNC_IO

    def absolute_name(self):
        return f"deepspeed.ops.aio.{self.NAME}_op"

    def sources(self):
        return ["aio/aio_io.cpp", "aio/aio_handle.cpp"]  # the bindings: end of aio_handle.cpp

    def include_paths(self):
        return ["aio"]

    def use_libaio(self):
        """Whether this build links libaio; False means the thread-pool pread/pwrite engine."""
        if os.environ.get("DS_AIO_NO_LIBAIO", "0") == "1":
            return False
        cxx = _which_cxx()
        return cxx is not None and libaio_link_error(cxx) == ""

    def libaio_status(self):
        """A line for ds_report: which engine the op gets and, without libaio, how to get it."""
        cxx = _which_cxx()
        if os.environ.get("DS_AIO_NO_LIBAIO", "0") == "1":
            return "libaio disabled by DS_AIO_NO_LIBAIO=1: using the pread/pwrite thread pool"
        why = libaio_link_error(cxx) if cxx else "no C++ compiler"
        if not why:
            return "libaio found: using kernel async I/O"
        return (f"libaio unusable ({why}): using the pread/pwrite thread pool. For libaio install "
                "libaio-dev (apt) / libaio-devel (yum), or point CFLAGS/LDFLAGS at its include/lib dirs")

    def cxx_args(self):
        args = ["-O3", "-std=c++17", "-g0", "-Wall", *_flag_env("CFLAGS")]
        return args + (["-DDS_AIO_LIBAIO"] if self.use_libaio() else [])

    def extra_ldflags(self):
        return [*_flag_env("LDFLAGS"), "-laio"] if self.use_libaio() else []

    def is_compatible(self, verbose=False):
        ok = super().is_compatible(verbose=verbose)
        if ok and not sys.platform.startswith("linux"):
            self.incompatible_reason = f"async_io needs Linux (pread/pwrite, O_DIRECT), not {sys.platform}"
            ok = False
        if verbose and ok and not self.use_libaio():
            from deepspeed.utils.logging import logger

            logger.warning("async_io: %s", self.libaio_status())
        return ok
