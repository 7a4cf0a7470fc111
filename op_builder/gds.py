"""Builder of the `gds` op (DeepNVMe ``gds_handle``: GPUDirect Storage through NVIDIA cuFile).

The handle has the aio handle's API; CUDA tensors move between GPU memory and the file without a
host bounce buffer. It needs a CUDA build of torch, the CUDA toolkit (nvcc's headers and
runtime) and cuFile's header and library, found in ``$CUFILE_HOME`` (``include/``, ``lib/`` or
``lib64/``), the CUDA toolkit, or the ``nvidia-cufile`` pip package. Where any is missing,
``is_compatible()`` is False and the reason names the missing piece and the alternative: the aio
handle (``deepspeed.ops.aio.aio_handle``), which moves device tensors through host memory.
"""
from __future__ import annotations

import glob
import importlib.util
import os
import sys

from .builder import CUDAOpBuilder, _nvcc_path

ALTERNATIVE = "use deepspeed.ops.aio.aio_handle (AsyncIOBuilder, same API) instead"


def _toolkit_roots():
    roots = [os.environ.get(v) for v in ("CUDA_HOME", "CUDA_PATH")]
    nvcc = _nvcc_path()
    if nvcc:
        roots.append(os.path.dirname(os.path.dirname(os.path.realpath(nvcc))))
    roots.append("/usr/local/cuda")
    return [r for r in roots if r]


def _candidate_roots():
    """Folders that may hold include/cufile.h and lib*/libcufile.so*, most specific first."""
    roots = [os.environ["CUFILE_HOME"]] if os.environ.get("CUFILE_HOME") else []
    for root in _toolkit_roots():
        roots += [root, *glob.glob(os.path.join(root, "targets", "*"))]
    spec = importlib.util.find_spec("nvidia")  # the nvidia-cufile wheel: nvidia/<cu13|cufile>/
    if spec is not None:
        for location in spec.submodule_search_locations or []:
            roots += sorted(glob.glob(os.path.join(location, "*")))
    roots.append("/usr")
    return roots


def find_cufile():
    """(include dir, library path) of cuFile; either is None when not found."""
    include = library = None
    for root in _candidate_roots():
        if include is None and os.path.isfile(os.path.join(root, "include", "cufile.h")):
            include = os.path.join(root, "include")
        if library is None:
            found = sorted(glob.glob(os.path.join(root, "lib*", "libcufile.so*")) +
                           glob.glob(os.path.join(root, "lib", "*-linux-gnu", "libcufile.so*")))
            found = [f for f in found if "rdma" not in os.path.basename(f)]
            library = found[0] if found else None
    return include, library


def cuda_runtime_include():
    """The CUDA toolkit's include dir holding cuda_runtime.h, or None."""
    for root in _toolkit_roots():
        for include in [os.path.join(root, "include"),
                        *glob.glob(os.path.join(root, "targets", "*", "include"))]:
            if os.path.isfile(os.path.join(include, "cuda_runtime.h")):
                return include
    return None


class GDSBuilder(CUDAOpBuilder):
    NAME = "gds"

    def absolute_name(self):
        return f"deepspeed.ops.gds.{self.NAME}_op"

    def sources(self):
        return ["gds/gds_handle.cpp", "gds/py_gds.cpp"]

    def include_paths(self):
        include, _ = find_cufile()
        return ["gds", "aio"] + ([include] if include else [])  # aio: the shared bindings

    def extra_ldflags(self):
        _, library = find_cufile()
        if library is None:
            return []
        return [f"-L{os.path.dirname(library)}", f"-l:{os.path.basename(library)}",
                f"-Wl,-rpath,{os.path.dirname(library)}"]

    def _jit_kwargs(self):
        # the sources are C++ calling the CUDA runtime (no .cu): torch adds CUDA's include and
        # library paths for a JIT build only when told
        return dict(super()._jit_kwargs(), with_cuda=True)

    def missing_pieces(self):
        """What GDS needs beyond a CUDA build (header, library, platform), each with a hint."""
        reasons = []
        if not sys.platform.startswith("linux"):
            reasons.append(f"GPUDirect Storage needs Linux, not {sys.platform}")
        include, library = find_cufile()
        if include is None:
            reasons.append("cufile.h was not found (install the CUDA toolkit's cuFile / "
                           "`pip install nvidia-cufile`, or set CUFILE_HOME)")
        if library is None:
            reasons.append("libcufile.so was not found (same sources as cufile.h)")
        return reasons

    def is_compatible(self, verbose=False):
        super().is_compatible(verbose=False)
        reasons = [r for r in [self.incompatible_reason] if r] + self.missing_pieces()
        self.incompatible_reason = f"{'; '.join(reasons)}; {ALTERNATIVE}" if reasons else ""
        if reasons and verbose:
            from deepspeed.utils.logging import logger

            logger.warning("gds is not compatible: %s", self.incompatible_reason)
        return not reasons
