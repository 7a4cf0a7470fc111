"""``dot``: the one matrix-multiply helper the Triton kernels share (``deepspeed.ops``'
Evoformer attention and the ``sparse_attention`` plugin's block-sparse kernels).

``tl.dot`` lets fp32 inputs run in TF32 on GPUs that have it; with ``IEEE`` the kernels ask for
full fp32 precision, so their fp32 results track a torch fp32 reference to 1e-5. A Triton
``jit`` function, called from other kernels only. Importing this module needs ``triton``.
"""
import triton
import triton.language as tl


@triton.jit
def dot(a, b, IEEE: tl.constexpr):
    if IEEE:
        return tl.dot(a, b, input_precision="ieee")
    return tl.dot(a, b)
