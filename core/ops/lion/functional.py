"""Lion (arXiv 2302.06675) over lists of fp32 tensors: the math FusedLion and DeepSpeedCPULion
share.

    c = sign(b1*m + (1-b1)*g)
    p = p - lr*wd*p        (decoupled, when wd > 0)
    p = p - lr*c
    m = b2*m + (1-b2)*g
"""
import torch


def lion_update_(params, grads, exp_avgs, *, lr, beta1, beta2, weight_decay):
    """Update ``params`` and ``exp_avgs`` in place; ``grads`` is not written."""
    direction = torch._foreach_lerp(exp_avgs, grads, 1.0 - beta1)
    torch._foreach_sign_(direction)
    if weight_decay:
        torch._foreach_mul_(params, 1.0 - lr * weight_decay)
    torch._foreach_add_(params, direction, alpha=-lr)
    torch._foreach_lerp_(exp_avgs, grads, 1.0 - beta2)


def lion_step_(optimizer):
    """One Lion step over every param group of a ``MultiTensorOptimizer`` (shared by FusedLion
    and DeepSpeedCPULion)."""
    for group in optimizer.param_groups:
        beta1, beta2 = group["betas"]
        for bucket in optimizer.buckets(group):
            optimizer.apply_fp32(bucket, lambda b: lion_update_(
                b.params, b.grads, b.states["exp_avg"], lr=group["lr"], beta1=beta1,
                beta2=beta2, weight_decay=group["weight_decay"]))
