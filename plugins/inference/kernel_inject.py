"""``replace_with_kernel_inject=True``: the fused inference path.

What it does to the (already AutoTP-split) model:

1. attention through ``torch.nn.functional.scaled_dot_product_attention`` (Hugging Face's
   ``"sdpa"`` attention implementation: flash / memory-efficient kernels on GPU); generation
   keeps its KV cache (Hugging Face's cache, ``use_cache=True``);
2. on GPU, the MLP's ``Linear -> GeLU`` pairs of the documented families (BERT
   ``intermediate.dense``, GPT-NeoX / Falcon ``dense_h_to_4h``, GPT-2-style ``c_fc`` are
   Conv1D and not touched) become one ``FusedBiasGeLU``: the matmul without bias, then, with
   ``use_triton=True``, a Triton kernel adding the bias and applying GeLU in one pass over the
   activations (one read and one write instead of three of each). Without it (or without
   Triton) it computes the same in eager PyTorch.

On CPU the fused kernels would not beat eager PyTorch, so the option falls back to AutoTP +
SDPA and logs one line saying so.
"""
import torch
import torch.nn.functional as F
from torch import nn

from deepspeed.utils import logging as ds_logging

logger = ds_logging.logger

# (linear attribute, activation attribute) of an MLP module computing act(linear(x))
FUSABLE = (("dense_h_to_4h", "act"), ("dense", "intermediate_act_fn"), ("fc1", "activation_fn"))


def use_sdpa(model):
    """Switch a Hugging Face model to SDPA attention; returns whether it could."""
    setter = getattr(model, "set_attn_implementation", None)
    if callable(setter):
        try:
            setter("sdpa")
            return True
        except (ValueError, ImportError, AttributeError):
            return False
    config = getattr(model, "config", None)
    if config is not None and hasattr(config, "_attn_implementation"):
        config._attn_implementation = "sdpa"
        return True
    return False


def _gelu_kind(act):
    """``"none"`` / ``"tanh"`` for an exact-GeLU / tanh-GeLU activation module, else None."""
    if isinstance(act, nn.GELU):
        return act.approximate
    return {"GELUActivation": "none", "NewGELUActivation": "tanh", "GELUTanh": "tanh",
            "PytorchGELUTanh": "tanh"}.get(type(act).__name__)


class FusedBiasGeLU(nn.Module):
    """``gelu(x @ weight.T + bias)`` with the bias and GeLU fused (Triton on CUDA)."""

    def __init__(self, linear, approximate="none", use_triton=False):
        super().__init__()
        self.linear = linear
        self.approximate = approximate
        self.use_triton = use_triton

    @property
    def weight(self):
        return self.linear.weight

    def forward(self, x):
        y = F.linear(x, self.linear.weight)
        return bias_gelu(y, self.linear.bias, self.approximate, self.use_triton)


def bias_gelu(y, bias, approximate="none", use_triton=False):
    """``gelu(y + bias)``: the Triton kernel for CUDA tensors with ``use_triton``
    (``init_inference(use_triton=True)``), else eager PyTorch."""
    if use_triton and y.is_cuda and _triton_ok():
        from deepspeed.inference.triton_bias_gelu import triton_bias_gelu

        return triton_bias_gelu(y, bias, approximate == "tanh")
    return F.gelu(y + bias, approximate=approximate)


def _triton_ok():
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


def fuse_bias_gelu(model, use_triton=False):
    """Replace each fusable ``act(linear(x))`` pair; returns the names of the fused Linears."""
    fused = []
    for name, module in model.named_modules():
        for lin_attr, act_attr in FUSABLE:
            linear, act = getattr(module, lin_attr, None), getattr(module, act_attr, None)
            if linear is None or act is None or isinstance(linear, FusedBiasGeLU):
                continue
            kind = _gelu_kind(act)
            bias = getattr(linear, "bias", None)
            if kind is None or bias is None or getattr(linear, "mp_group", None) is not None:
                continue
            if not isinstance(getattr(linear, "weight", None), torch.Tensor):
                continue
            setattr(module, lin_attr, FusedBiasGeLU(linear, kind, use_triton))
            setattr(module, act_attr, nn.Identity())
            fused.append(f"{name}.{lin_attr}".lstrip("."))
    return fused


def inject(model, on_gpu, use_triton=False):
    """Apply the fused path (GPU; its bias-GeLU a Triton kernel with ``use_triton``) or its
    CPU fallback; returns what was done."""
    sdpa = use_sdpa(model)
    if not on_gpu:
        logger.info("init_inference: replace_with_kernel_inject=True on CPU falls back to AutoTP "
                    f"with {'SDPA attention' if sdpa else 'the model attention'} (the fused "
                    "kernels are GPU-only)")
        return {"sdpa": sdpa, "fused": []}
    return {"sdpa": sdpa, "fused": fuse_bias_gelu(model, use_triton)}
