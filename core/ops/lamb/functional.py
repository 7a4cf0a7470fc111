"""DeepSpeed's LAMB (arXiv 1904.00962) over lists of fp32 tensors, one trust ratio per tensor.

    g = g / combined_scale
    m = b1*m + (1-b1)*g                   v = b2*v + (1-b2)*g^2       (not bias-corrected)
    denom = sqrt(v + eps) if eps_inside_sqrt else sqrt(v) + eps
    u = m/denom + wd*p
    coeff = clamp(|p|/|u|, min_coeff, max_coeff), or 1 when either norm is 0
    p = p - step_size*coeff*u,  step_size = lr*sqrt(1-b2^t)/(1-b1^t) (lr without bias_correction)
"""
import math

import torch


def lamb_update_(params, grads, exp_avgs, exp_avg_sqs, *, step, lr, beta1, beta2, eps,
                 eps_inside_sqrt, weight_decay, bias_correction, max_coeff, min_coeff,
                 grad_scale=1.0):
    """Update ``params``, ``exp_avgs`` and ``exp_avg_sqs`` in place and return the 1-D tensor of
    the per-tensor LAMB coefficients (kept on device: no host sync per tensor)."""
    if grad_scale != 1.0:
        grads = torch._foreach_div(grads, grad_scale)
    torch._foreach_lerp_(exp_avgs, grads, 1.0 - beta1)
    torch._foreach_mul_(exp_avg_sqs, beta2)
    torch._foreach_addcmul_(exp_avg_sqs, grads, grads, value=1.0 - beta2)
    if eps_inside_sqrt:
        denom = torch._foreach_sqrt(torch._foreach_add(exp_avg_sqs, eps))
    else:
        denom = torch._foreach_sqrt(exp_avg_sqs)
        torch._foreach_add_(denom, eps)
    updates = torch._foreach_div(exp_avgs, denom)
    if weight_decay:
        torch._foreach_add_(updates, params, alpha=weight_decay)
    param_norms = torch.stack(torch._foreach_norm(params))
    update_norms = torch.stack(torch._foreach_norm(updates))
    ratio = (param_norms / update_norms).clamp_(min_coeff, max_coeff)
    coeffs = torch.where((param_norms > 0) & (update_norms > 0), ratio, torch.ones_like(ratio))
    step_size = lr
    if bias_correction:
        step_size = lr * math.sqrt(1.0 - beta2 ** step) / (1.0 - beta1 ** step)
    torch._foreach_mul_(updates, list(coeffs.unbind()))
    torch._foreach_add_(params, updates, alpha=-step_size)
    return coeffs
