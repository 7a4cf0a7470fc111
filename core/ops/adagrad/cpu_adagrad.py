"""DeepSpeedCPUAdagrad: Adagrad for ZeRO-Offload, on host fp32 master weights.

    g = g + wd*p           (when wd > 0)
    s = s + g^2            (state 'exp_avg_sq')
    p = p - lr * g / (sqrt(s) + eps)

Dense gradients go through one foreach launch per device/dtype; sparse gradients (an
``nn.Embedding(sparse=True)``) update only the rows they touch. Dense fp32 contiguous buckets go
through the native kernel (csrc/cpu/cpu_adagrad.cpp) when it builds, which writes bf16/fp16 host
copies in the same pass (see ``deepspeed.ops.adam.native``).
"""
import torch

from deepspeed.ops.adam.multi_tensor_apply import (CPUOptimizerMixin, MultiTensorOptimizer,
                                                   check_hyperparameters)
from deepspeed.ops.adam.native import HalfTargets, load_kernel, native_ready, run_native
from deepspeed.ops.op_builder.cpu_adagrad import CPUAdagradBuilder


def adagrad_update_(params, grads, sums, *, lr, eps, weight_decay):
    """Update ``params`` and ``sums`` in place (dense fp32 lists); ``grads`` is not written."""
    if weight_decay:
        grads = torch._foreach_add(grads, params, alpha=weight_decay)
    torch._foreach_addcmul_(sums, grads, grads, value=1.0)
    std = torch._foreach_sqrt(sums)
    torch._foreach_add_(std, eps)
    torch._foreach_addcdiv_(params, grads, std, value=-lr)


def _sparse_like(grad, indices, values):
    # indices come from a coalesced torch tensor: valid by construction, no need to re-check
    return torch.sparse_coo_tensor(indices, values, grad.shape, check_invariants=False)


def sparse_adagrad_update_(param, grad, state_sum, *, lr, eps, weight_decay):
    """The same update restricted to the entries a sparse ``grad`` holds."""
    grad = grad.coalesce()
    indices, values = grad._indices(), grad._values().float()
    master = param.float()
    if weight_decay:
        values = values + weight_decay * master.sparse_mask(grad)._values()
    sum32 = state_sum.float()
    sum32.add_(_sparse_like(grad, indices, values * values))
    std = sum32.sparse_mask(grad)._values().sqrt_().add_(eps)
    master.add_(_sparse_like(grad, indices, values / std), alpha=-lr)
    if master is not param:
        param.copy_(master)
    if sum32 is not state_sum:
        state_sum.copy_(sum32)


class DeepSpeedCPUAdagrad(CPUOptimizerMixin, MultiTensorOptimizer):
    """``amsgrad`` is accepted and ignored, as upstream. ``use_native``: None uses the native
    kernel when it builds, False forces the PyTorch path, True requires the kernel."""

    state_keys = ("exp_avg_sq",)

    def __init__(self, model_params, lr=1e-2, eps=1e-10, weight_decay=0, amsgrad=False,
                 fp32_optimizer_states=True, use_native=None):
        check_hyperparameters("DeepSpeedCPUAdagrad", lr=lr, eps=eps, weight_decay=weight_decay)
        super().__init__(model_params, dict(lr=lr, eps=eps, weight_decay=weight_decay,
                                            amsgrad=amsgrad))
        self.fp32_optimizer_states = bool(fp32_optimizer_states)
        self._native = load_kernel(CPUAdagradBuilder, "DeepSpeedCPUAdagrad", use_native)

    @property
    def native(self):
        """The loaded kernel module, None on the PyTorch path (and after unpickling)."""
        return getattr(self, "_native", None)

    def _check_param(self, param, grad):
        if grad.is_sparse:  # supported here, unlike the other DeepSpeed optimizers
            grad = grad._values()
        super()._check_param(param, grad)

    @torch.no_grad()
    def step(self, closure=None, fp16_param_groups=None):
        loss = self.run_closure(closure)
        targets = HalfTargets(self, fp16_param_groups)
        for group in self.param_groups:
            hyper = dict(lr=group["lr"], eps=group["eps"], weight_decay=group["weight_decay"])
            for bucket in self.buckets(group):
                dense = [i for i, grad in enumerate(bucket.grads) if not grad.is_sparse]
                for i in range(len(bucket.grads)):
                    if bucket.grads[i].is_sparse:
                        sparse_adagrad_update_(bucket.params[i], bucket.grads[i],
                                               bucket.states["exp_avg_sq"][i], **hyper)
                if dense:
                    self._update_dense(bucket.subset(dense), hyper, targets)
        targets.finish()
        return loss

    def _update_dense(self, bucket, hyper, targets):
        if self.native is None or not native_ready(bucket):
            self.apply_fp32(bucket, lambda b: adagrad_update_(
                b.params, b.grads, b.states["exp_avg_sq"], **hyper))
            return
        run_native(self.native.adagrad_update, bucket, ("exp_avg_sq",), targets, **hyper)
