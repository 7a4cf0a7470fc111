"""FusedLion: the multi-tensor Lion optimizer.

On a CUDA device where the ``fused_lion`` op builds (``FusedLionBuilder``, csrc/lion), the params
of a group that share a device and dtype are updated by one multi-tensor kernel launch;
elsewhere (CPU, no nvcc, a failed build) the same math runs as one foreach launch per operation.
"""
import torch

from deepspeed.ops.adam.fused_adam import CHUNK_SIZE, kernel_accepts, load_cuda_op
from deepspeed.ops.adam.multi_tensor_apply import MultiTensorOptimizer, check_hyperparameters
from deepspeed.ops.lion.functional import lion_update_


class FusedLion(MultiTensorOptimizer):
    """``set_grad_none`` makes ``zero_grad()`` drop gradients instead of zeroing them."""

    state_keys = ("exp_avg",)

    def __init__(self, params, lr=1e-4, betas=(0.9, 0.99), weight_decay=0.0, set_grad_none=True):
        check_hyperparameters("FusedLion", lr=lr, betas=betas, weight_decay=weight_decay)
        super().__init__(params, dict(lr=lr, betas=tuple(betas), weight_decay=weight_decay))
        self.set_grad_none = set_grad_none
        # False forces the PyTorch path on GPUs too (to compare against the kernel)
        self.use_cuda_kernel = True

    def zero_grad(self, set_to_none=None):
        super().zero_grad(set_to_none=self.set_grad_none if set_to_none is None else set_to_none)

    @torch.no_grad()
    def step(self, closure=None):
        loss = self.run_closure(closure)
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            hyper = dict(lr=group["lr"], beta1=beta1, beta2=beta2,
                         weight_decay=group["weight_decay"])
            for bucket in self.buckets(group):
                lists = [bucket.params, bucket.grads, bucket.states["exp_avg"]]
                op = (load_cuda_op("fused_lion")
                      if self.use_cuda_kernel and kernel_accepts(lists) else None)
                if op is not None:
                    op.multi_tensor_lion(CHUNK_SIZE, lists, **hyper)
                    continue
                self.apply_fp32(bucket, lambda b: lion_update_(
                    b.params, b.grads, b.states["exp_avg"], **hyper))
        return loss
