"""Builder entry of the block-sparse attention op (``deepspeed.sparse_attention``).

The op is written in Triton, which compiles its kernels itself at first launch: there is no
C++ to build ahead of time (``PREBUILDABLE = False``: ``DS_BUILD_SPARSE_ATTN`` skips it with
that reason) and nothing to JIT through ninja. The entry exists so that ``ds_report`` says
whether the Triton kernels can run here and why not; the blocked torch path runs everywhere
else, on CPU by default. The shared Triton-entry behaviour is in ``triton_op.TritonOpBuilder``;
this op also needs its plugin installed.
"""
import importlib.util

from .triton_op import TritonOpBuilder


class SparseAttnBuilder(TritonOpBuilder):
    NAME = "sparse_attn"
    KERNELS = "deepspeed.sparse_attention.triton_kernels"
    TORCH_PATH = "the blocked torch path"
    INSTALL_HINT = "pip install 'deepspeed[sparse]'"

    def missing(self):
        if importlib.util.find_spec("deepspeed.sparse_attention") is None:
            return ["the sparse_attention plugin is not installed"]
        return []
