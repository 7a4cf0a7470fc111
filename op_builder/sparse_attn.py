"""Builder entry of the block-sparse attention op (``deepspeed.sparse_attention``).

The op is written in Triton, which compiles its kernels itself at first launch: there is no
C++ to build ahead of time (``PREBUILDABLE = False``: ``DS_BUILD_SPARSE_ATTN`` skips it with
that reason) and nothing to JIT through ninja. The entry exists so that ``ds_report`` says
whether the Triton kernels can run here and why not; the blocked torch path runs everywhere
else, on CPU by default.
"""
import importlib
import importlib.util
import os

from .builder import OpBuilder


class SparseAttnBuilder(OpBuilder):
    NAME = "sparse_attn"
    PREBUILDABLE = False

    def absolute_name(self):
        return "deepspeed.sparse_attention.triton_kernels"

    def sources(self):
        return []

    def _triton_version(self):
        try:
            triton = importlib.import_module("triton")
        except ImportError:
            return None
        return getattr(triton, "__version__", "unknown")

    def is_installed(self):
        """The kernels' module and triton are both importable (nothing else is installed)."""
        return self._triton_version() is not None and importlib.util.find_spec(
            "deepspeed.sparse_attention") is not None

    def is_compatible(self, verbose=False):
        reasons = []
        if importlib.util.find_spec("deepspeed.sparse_attention") is None:
            reasons.append("the sparse_attention plugin is not installed")
        version = self._triton_version()
        if version is None:
            reasons.append("triton is not installed (pip install 'deepspeed[sparse]'); the "
                           "blocked torch path is used instead")
        try:
            import torch

            has_cuda = torch.cuda.is_available()
        except ImportError:
            has_cuda = False
            reasons.append("torch is not installed")
        interpreter = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
        if not has_cuda and not interpreter:
            reasons.append("no CUDA device: the Triton kernels need a GPU (or TRITON_INTERPRET=1 "
                           "for the slow interpreter); the blocked torch path runs on CPU")
        self.incompatible_reason = "; ".join(reasons)
        if reasons and verbose:
            from deepspeed.utils.logging import logger

            logger.warning("%s is not compatible: %s", self.NAME, self.incompatible_reason)
        return not reasons

    def load(self, verbose=True):
        """The Triton kernels' module."""
        if not self.is_compatible(verbose=verbose):
            from .builder import OpBuildError

            raise OpBuildError(f"op '{self.NAME}' cannot run here: {self.incompatible_reason}")
        return importlib.import_module(self.absolute_name())

    def jit_load(self, verbose=True):
        return self.load(verbose=verbose)

    def builder(self):
        from .builder import OpBuildError

        raise OpBuildError(f"op '{self.NAME}' is Triton code compiled at first launch; there is "
                           f"nothing to pre-build")
