"""Adam / AdamW over lists of fp32 tensors: the math DeepSpeedCPUAdam and FusedAdam share.

    m = b1*m + (1-b1)*g                    v = b2*v + (1-b2)*g^2
    L2 (adamw_mode=False), wd > 0:         g = g + wd*p           (before the moments)
    decoupled (adamw_mode=True), wd > 0:   p = p - lr*wd*p
    p = p - lr/(1-b1^t) * m / (sqrt(v)/sqrt(1-b2^t) + eps)   (both corrections 1 without
                                                              bias_correction)

With bias correction (the default) this is exactly torch's fused Adam/AdamW kernel, used where the
device has one (several times faster than the foreach path on CPU); the foreach path covers
``bias_correction=False`` and devices without the kernel. torch's kernel also takes fp16/bf16
lists as they are, computing in fp32 registers: the same numbers as fp32 copies updated and
rounded back (bitwise, as the tests check on CPU, and on CUDA where a GPU is), without the
copies' extra passes over memory (with them the bf16 path took 7.6x torch's step on an H200).
"""
import functools
import math

import torch

from deepspeed.utils.logging import logger


def fused_kernel_available(device_type: str) -> bool:
    """Whether torch has a fused Adam kernel for this device type (CPU since torch 2.4)."""
    return fused_kernel_takes(device_type, torch.float32)


@functools.lru_cache(maxsize=None)
def fused_kernel_takes(device_type: str, dtype: torch.dtype) -> bool:
    """Whether torch's fused Adam kernel runs on ``dtype`` tensors of this device type (probed
    once on a one-element tensor)."""
    if not hasattr(torch, "_fused_adamw_"):
        return False
    probe = [torch.zeros(1, device=device_type, dtype=dtype)]
    try:
        torch._fused_adamw_(probe, [torch.zeros_like(probe[0])], [torch.zeros_like(probe[0])],
                            [torch.zeros_like(probe[0])], [], [torch.ones((), device=device_type)],
                            lr=0.0, beta1=0.9, beta2=0.999, weight_decay=0.0, eps=1e-8,
                            amsgrad=False, maximize=False)
    except (RuntimeError, NotImplementedError) as exc:
        logger.debug(f"no fused Adam kernel for {device_type} {dtype}, using foreach ops: {exc}")
        return False
    return True


def takes_as_is(params, grads, exp_avgs, exp_avg_sqs, bias_correction) -> bool:
    """Whether torch's fused kernel can update these 16-bit lists in place, without fp32
    copies: bias correction on (the kernel always applies it), one dtype for params, grads
    and moments (the kernel reads every list as the params' type), a kernel for that device
    and dtype."""
    dtype, device = params[0].dtype, params[0].device.type
    if not bias_correction or dtype not in (torch.float16, torch.bfloat16):
        return False
    if not (fused_kernel_available(device) and fused_kernel_takes(device, dtype)):
        return False
    return all(t.dtype == dtype for ts in (params, grads, exp_avgs, exp_avg_sqs) for t in ts)


def adam_bucket_(optimizer, bucket, *, lr, beta1, beta2, eps, weight_decay, bias_correction,
                 adamw_mode):
    """One Adam update of ``bucket`` (a ``multi_tensor_apply.Bucket`` of ``optimizer``): in
    place where torch's fused kernel takes its tensors as they are, else on fp32 copies
    written back (``optimizer.apply_fp32``)."""
    def update(b):
        adam_update_(b.params, b.grads, b.states["exp_avg"], b.states["exp_avg_sq"], step=b.step,
                     lr=lr, beta1=beta1, beta2=beta2, eps=eps, weight_decay=weight_decay,
                     bias_correction=bias_correction, adamw_mode=adamw_mode)

    if takes_as_is(bucket.params, bucket.grads, bucket.states["exp_avg"],
                   bucket.states["exp_avg_sq"], bias_correction):
        update(bucket)
    else:
        optimizer.apply_fp32(bucket, update)


def adam_update_(params, grads, exp_avgs, exp_avg_sqs, *, step, lr, beta1, beta2, eps,
                 weight_decay, bias_correction, adamw_mode):
    """Update ``params``, ``exp_avgs`` and ``exp_avg_sqs`` in place; ``grads`` is not written."""
    if bias_correction and fused_kernel_available(params[0].device.type):
        kernel = torch._fused_adamw_ if adamw_mode else torch._fused_adam_
        # torch 2.13's CPU fused kernel mis-reads strided gradients (~2e-3 abs error measured)
        grads = [g if g.is_contiguous() else g.contiguous() for g in grads]
        steps = [torch.tensor(float(step), device=params[0].device)] * len(params)
        kernel(params, grads, exp_avgs, exp_avg_sqs, [], steps, lr=lr, beta1=beta1, beta2=beta2,
               weight_decay=weight_decay, eps=eps, amsgrad=False, maximize=False)
        return
    if weight_decay and not adamw_mode:
        grads = torch._foreach_add(grads, params, alpha=weight_decay)
    torch._foreach_lerp_(exp_avgs, grads, 1.0 - beta1)
    torch._foreach_mul_(exp_avg_sqs, beta2)
    torch._foreach_addcmul_(exp_avg_sqs, grads, grads, value=1.0 - beta2)
    bias1 = 1.0 - beta1 ** step if bias_correction else 1.0
    bias2 = 1.0 - beta2 ** step if bias_correction else 1.0
    denom = torch._foreach_sqrt(exp_avg_sqs)
    if bias2 != 1.0:
        torch._foreach_div_(denom, math.sqrt(bias2))
    torch._foreach_add_(denom, eps)
    if weight_decay and adamw_mode:
        torch._foreach_mul_(params, 1.0 - lr * weight_decay)
    torch._foreach_addcdiv_(params, exp_avgs, denom, value=-lr / bias1)


def adam_step_(optimizer, adamw_mode):
    """One Adam step over every param group of a ``MultiTensorOptimizer`` (FusedAdam and
    DeepSpeedCPUAdam differ only in their step() signatures, not in this loop)."""
    for group in optimizer.param_groups:
        beta1, beta2 = group["betas"]
        for bucket in optimizer.buckets(group):
            adam_bucket_(optimizer, bucket, lr=group["lr"], beta1=beta1, beta2=beta2,
                         eps=group["eps"], weight_decay=group["weight_decay"],
                         bias_correction=group["bias_correction"], adamw_mode=adamw_mode)
