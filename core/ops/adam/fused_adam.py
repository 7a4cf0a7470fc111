"""FusedAdam: DeepSpeed's multi-tensor Adam/AdamW, a drop-in for ``torch.optim.AdamW`` (or
``torch.optim.Adam`` with ``adam_w_mode=False``).

On a CUDA device where the ``fused_adam`` op builds, the params of a group that share a device
and dtype are updated by one multi-tensor kernel launch (csrc/adam); elsewhere (CPU, no nvcc, a
failed build, mixed grad dtypes) the same math runs on the PyTorch path: torch's own fused Adam
kernel where the device has one, else one foreach launch per operation. fp16/bf16 params keep
fp16/bf16 moments and are computed in fp32 either way; the PyTorch path hands 16-bit tensors to
torch's fused kernel as they are (it computes in fp32 registers) rather than through fp32 copies.
"""
import torch

from deepspeed.ops.adam.functional import adam_bucket_
from deepspeed.ops.adam.multi_tensor_apply import MultiTensorOptimizer, check_hyperparameters
from deepspeed.ops.op_builder import OpBuildError, get_op_builder
from deepspeed.utils.logging import logger

# The fewest elements a block of the multi-tensor kernels takes (the kernels' chunk_size
# argument): a launch has as many blocks as the GPU keeps resident, fewer for a small update, so
# that a block's setup is amortised over at least this many elements.
CHUNK_SIZE = 16384
_NATIVE_OPS = {}


def load_cuda_op(name):
    """The loaded CUDA op ``name`` ('fused_adam', 'fused_lamb'), or None when it cannot be built
    here; tried once per process, and the reason is logged so a slow fallback is explainable."""
    if name in _NATIVE_OPS:
        return _NATIVE_OPS[name]
    module = None
    builder_class = get_op_builder(name)
    if builder_class is None:
        logger.info(f"no op builder named {name!r}; using the PyTorch path")
    else:
        builder = builder_class()
        if not builder.is_compatible():
            logger.info(f"{name} CUDA op unavailable ({builder.incompatible_reason}); "
                        f"using the PyTorch path")
        else:
            try:
                module = builder.load(verbose=False)
            except OpBuildError as err:
                logger.warning(f"{name} CUDA op failed to build, using the PyTorch path: {err}")
    _NATIVE_OPS[name] = module
    return module


def kernel_accepts(tensor_lists):
    """Whether one launch of a multi-tensor kernel can take these lists ([params, grads,
    *states]): a CUDA device; params and grads of one dtype the kernels have (fp32/fp16/bf16);
    the states of that dtype or fp32; all contiguous (the kernels walk raw pointers). One
    device is checked on the first tensor only: a bucket's params share one (it is part of the
    bucket's key), their grads and states live with them, and the op's frontend checks every
    tensor again and raises rather than launch on a mixed list. Per step this runs over every
    tensor of the optimizer, so it reads only dtypes and contiguity (a device object per tensor
    cost more host time than the H200 kernel itself)."""
    first = tensor_lists[0][0]
    dtype = first.dtype
    if first.device.type != "cuda" or dtype not in (torch.float32, torch.float16,
                                                    torch.bfloat16):
        return False
    state_dtype = tensor_lists[2][0].dtype if len(tensor_lists) > 2 else dtype
    if state_dtype is not dtype and state_dtype is not torch.float32:
        return False
    return all(all(t.dtype is want and t.is_contiguous() for t in tensors)
               for want, tensors in zip([dtype, dtype] + [state_dtype] * (len(tensor_lists) - 2),
                                        tensor_lists))

_LEGACY_STEP_ARGS = ("grads", "output_params", "scale", "grad_norms", "grad_scaler")


class FusedAdam(MultiTensorOptimizer):
    """``amsgrad`` is not supported (RuntimeError, as upstream). ``set_grad_none`` makes
    ``zero_grad()`` drop gradients instead of zeroing them. The step count lives in
    ``group['step']`` so a caller that regroups params (ZeRO-3 sub-groups) can carry it over."""

    state_keys = ("exp_avg", "exp_avg_sq")

    def __init__(self, params, lr=1e-3, bias_correction=True, betas=(0.9, 0.999), eps=1e-8,
                 adam_w_mode=True, weight_decay=0., amsgrad=False, set_grad_none=True):
        if amsgrad:
            raise RuntimeError("FusedAdam does not support the AMSGrad variant.")
        check_hyperparameters("FusedAdam", lr=lr, eps=eps, betas=betas, weight_decay=weight_decay)
        defaults = dict(lr=lr, bias_correction=bias_correction, betas=tuple(betas), eps=eps,
                        weight_decay=weight_decay)
        super().__init__(params, defaults)
        self.adam_w_mode = bool(adam_w_mode)
        self.set_grad_none = set_grad_none
        # False forces the PyTorch path on GPUs too (to compare against the kernel)
        self.use_cuda_kernel = True

    def zero_grad(self, set_to_none=None):
        super().zero_grad(set_to_none=self.set_grad_none if set_to_none is None else set_to_none)

    @torch.no_grad()
    def step(self, closure=None, grads=None, output_params=None, scale=None, grad_norms=None,
             grad_scaler=None):
        """One Adam step over every param with a gradient. The extra arguments of the old
        apex-style API are refused rather than silently ignored."""
        if any(arg is not None for arg in (grads, output_params, scale, grad_norms, grad_scaler)):
            raise RuntimeError("FusedAdam has been updated. Simply initialize it identically to "
                               "torch.optim.Adam, and call step() with no arguments.")
        loss = self.run_closure(closure)
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            hyper = dict(lr=group["lr"], beta1=beta1, beta2=beta2, eps=group["eps"],
                         weight_decay=group["weight_decay"])
            for bucket in self.buckets(group):
                lists = [bucket.params, bucket.grads, bucket.states["exp_avg"],
                         bucket.states["exp_avg_sq"]]
                op = (load_cuda_op("fused_adam")
                      if self.use_cuda_kernel and kernel_accepts(lists) else None)
                if op is not None:
                    op.multi_tensor_adam(CHUNK_SIZE, lists, step=bucket.step,
                                         mode=int(self.adam_w_mode),
                                         bias_correction=bool(group["bias_correction"]), **hyper)
                    continue
                adam_bucket_(self, bucket, bias_correction=group["bias_correction"],
                             adamw_mode=self.adam_w_mode, **hyper)
        return loss
