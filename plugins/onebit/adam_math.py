"""The Adam update the 1-bit optimizers apply once the momentum is known, written like
``torch.optim.Adam``'s single-tensor path so that the warm-up matches it to rounding.

``bias_correction`` uses the number of momentum updates for ``m`` and the number of *variance*
updates for ``v``: after the variance freezes its correction freezes with it (upstream omits the
correction altogether; with ``bias_correction=False`` this is exactly that). Weight decay is
decoupled (``p -= lr * wd * p``), as upstream's ``update = m / denom + wd * p``.
"""
import math


def adam_denominator(exp_avg_sq, var_updates, beta2, eps, eps_inside_sqrt, bias_correction):
    correction = 1.0 - beta2 ** var_updates if bias_correction and var_updates else 1.0
    if eps_inside_sqrt:
        return (exp_avg_sq / correction).add_(eps).sqrt_()
    return (exp_avg_sq.sqrt() / math.sqrt(correction)).add_(eps)


def adam_apply_(param, exp_avg, denom, step, lr, beta1, weight_decay, bias_correction):
    """``param -= lr * (m_hat / denom + wd * param)`` in place (``param`` is fp32)."""
    if weight_decay:
        param.mul_(1.0 - lr * weight_decay)
    correction = 1.0 - beta1 ** step if bias_correction else 1.0
    param.addcdiv_(exp_avg, denom, value=-lr / correction)
