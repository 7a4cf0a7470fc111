"""FusedLamb: DeepSpeed's LAMB with the trust ratio clamped to [min_coeff, max_coeff].

``max_grad_norm`` clips by the norm of each group's gradients (``grad_norms`` passes it in, as the
norm of the *scaled* gradients; otherwise it is computed); ``scale`` undoes a loss scale.

On a CUDA device where the ``fused_lamb`` op builds, each bucket (params sharing a device and
dtype) is one two-pass kernel (csrc/lamb: moments and per-tensor norms, then the clamped
trust-ratio update); elsewhere the same math runs as foreach launches.
"""
import math

import torch

from deepspeed.ops.adam.fused_adam import kernel_accepts, load_cuda_op
from deepspeed.ops.adam.multi_tensor_apply import (MultiTensorOptimizer, check_hyperparameters,
                                                   per_group)
from deepspeed.ops.lamb.functional import lamb_update_


class FusedLamb(MultiTensorOptimizer):
    """``amsgrad`` is not supported (RuntimeError, as upstream). ``get_lamb_coeffs()`` gives
    the coefficients of the last step, one per updated param, in param-group order."""

    state_keys = ("exp_avg", "exp_avg_sq")
    per_param_step = True

    def __init__(self, params, lr=1e-3, bias_correction=True, betas=(0.9, 0.999), eps=1e-8,
                 eps_inside_sqrt=False, weight_decay=0., max_grad_norm=0., max_coeff=10.0,
                 min_coeff=0.01, amsgrad=False):
        if amsgrad:
            raise RuntimeError("FusedLamb does not support the AMSGrad variant.")
        check_hyperparameters("FusedLamb", lr=lr, eps=eps, betas=betas, weight_decay=weight_decay)
        if not 0 <= min_coeff <= max_coeff:
            raise ValueError(f"FusedLamb: need 0 <= min_coeff <= max_coeff, got "
                             f"min_coeff={min_coeff}, max_coeff={max_coeff}")
        defaults = dict(lr=lr, bias_correction=bias_correction, betas=tuple(betas), eps=eps,
                        weight_decay=weight_decay, max_grad_norm=max_grad_norm,
                        max_coeff=max_coeff, min_coeff=min_coeff)
        super().__init__(params, defaults)
        self.eps_inside_sqrt = bool(eps_inside_sqrt)
        self._coeffs = []
        # False forces the PyTorch path on GPUs too (to compare against the kernel)
        self.use_cuda_kernel = True

    def get_lamb_coeffs(self):
        return [float(coeff) for _, coeff in sorted(self._coeffs, key=lambda item: item[0])]

    def _combined_scale(self, group, grads, scale, grad_norm):
        if group["max_grad_norm"] <= 0:
            return scale
        if grad_norm is None:
            grad_norm = math.sqrt(sum(float(torch.linalg.vector_norm(g.float())) ** 2
                                      for g in grads if g is not None))
        clip = ((float(grad_norm) / scale) + 1e-6) / group["max_grad_norm"]
        return clip * scale if clip > 1 else scale

    @torch.no_grad()
    def step(self, closure=None, grads=None, output_params=None, scale=1., grad_norms=None):
        """``grads`` / ``output_params``: optional per-group lists replacing ``p.grad`` and
        receiving a copy of each updated param (the legacy fp16 API)."""
        loss = self.run_closure(closure)
        count = len(self.param_groups)
        grads = per_group(grads, count, "grads")
        outputs = per_group(output_params, count, "output_params")
        norms = list(grad_norms) if grad_norms is not None else [None] * count
        if len(norms) != count:
            raise ValueError(f"grad_norms: got {len(norms)} norms for {count} param groups")
        self._coeffs = []
        for index, (group, group_grads, group_outputs, norm) in enumerate(
                zip(self.param_groups, grads, outputs, norms)):
            if group_grads is None:
                group_grads = [p.grad for p in group["params"]]
            combined = self._combined_scale(group, group_grads, scale, norm)
            beta1, beta2 = group["betas"]
            order = {id(p): (index, i) for i, p in enumerate(group["params"])}
            hyper = dict(lr=group["lr"], beta1=beta1, beta2=beta2, eps=group["eps"],
                         eps_inside_sqrt=self.eps_inside_sqrt,
                         weight_decay=group["weight_decay"],
                         bias_correction=bool(group["bias_correction"]),
                         max_coeff=group["max_coeff"], min_coeff=group["min_coeff"],
                         grad_scale=float(combined))
            for bucket in self.buckets(group, grads=group_grads):
                lists = [bucket.params, bucket.grads, bucket.states["exp_avg"],
                         bucket.states["exp_avg_sq"]]
                op = (load_cuda_op("fused_lamb")
                      if self.use_cuda_kernel and kernel_accepts(lists) else None)
                if op is not None:
                    coeffs = op.lamb(*lists, step=bucket.step, **hyper)
                else:
                    coeffs = self.apply_fp32(bucket, lambda b: lamb_update_(
                        b.params, b.grads, b.states["exp_avg"], b.states["exp_avg_sq"],
                        step=b.step, **hyper))
                self._coeffs += [(order[id(p)], c) for p, c in zip(bucket.params, coeffs.unbind())]
            if group_outputs is not None:
                for param, out in zip(group["params"], group_outputs):
                    if out is not None:
                        out.copy_(param.view_as(out))
        return loss
