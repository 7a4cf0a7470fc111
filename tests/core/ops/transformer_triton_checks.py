"""The transformer layer on its Triton kernels against the same layer on the torch path, in a
process of their own (``TRITON_INTERPRET=1`` must be set before Triton is imported).
``python transformer_triton_checks.py [cpu|cuda]``; one line per case, non-zero exit on a failure."""
import copy
import sys

import torch

from deepspeed.ops.transformer import DeepSpeedTransformerConfig, DeepSpeedTransformerLayer
from triton_check_runner import check_all

FLAGS = ("normalize_invertible", "gelu_checkpoint", "attn_dropout_checkpoint")
TOL = {torch.float32: 1e-5, torch.float16: 2e-2, torch.bfloat16: 5e-2}


def cases(device):
    dtypes = [torch.float32] + ([torch.float16, torch.bfloat16] if device == "cuda" else [])
    flag_sets = [{}, {f: True for f in FLAGS}]
    return [(pre, dtype, flags) for pre in (False, True) for dtype in dtypes for flags in flag_sets]


def run(layer, x, mask):
    out = layer(x, mask)
    grad = torch.linspace(-1, 1, out.numel(), device=x.device).view_as(out).to(out.dtype)
    return [out] + list(torch.autograd.grad(out, [x] + list(layer.parameters()), grad))


def check(pre, dtype, flags, device):
    torch.manual_seed(0)
    cfg = DeepSpeedTransformerConfig(hidden_size=32, heads=4, intermediate_size=64, num_hidden_layers=2,
                                     initializer_range=0.02, attn_dropout_ratio=0.0,
                                     hidden_dropout_ratio=0.0, pre_layer_norm=pre, **flags)
    ref = DeepSpeedTransformerLayer(cfg).to(device)
    with torch.no_grad():
        for p in ref.parameters():
            p.add_(0.1 * torch.randn_like(p))
    ref = ref.to(dtype)
    fused = copy.deepcopy(ref)
    ref.backend, fused.backend = "torch", "triton"
    x = torch.randn(2, 8, 32, device=device, dtype=dtype, requires_grad=True)
    mask = torch.zeros(2, 1, 1, 8, device=device, dtype=dtype)
    mask[1, ..., -3:] = -10000.0
    for got, want in zip(run(fused, x, mask), run(ref, x, mask)):
        scale = max(1.0, want.abs().max().item())
        torch.testing.assert_close(got.float(), want.float(), rtol=TOL[dtype], atol=TOL[dtype] * scale)


if __name__ == "__main__":
    device = sys.argv[1] if len(sys.argv) > 1 else "cpu"
    check_all(cases(device), lambda pre, dtype, flags: check(pre, dtype, flags, device))
