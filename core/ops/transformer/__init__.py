"""The DeepSpeed transformer kernel (`deepspeed.ops.transformer`): a fused BERT encoder layer.

``DeepSpeedTransformerLayer(DeepSpeedTransformerConfig(...))``: Triton kernels on GPU, torch ops
(SDPA, fused LayerNorm) on CPU; see ``transformer.py``. Also exported as
``deepspeed.DeepSpeedTransformerConfig`` / ``deepspeed.DeepSpeedTransformerLayer``.
"""
from deepspeed.ops.transformer.config import DeepSpeedTransformerConfig, TransformerConfig
from deepspeed.ops.transformer.transformer import DeepSpeedTransformerLayer

__all__ = ["DeepSpeedTransformerConfig", "DeepSpeedTransformerLayer", "TransformerConfig"]

from deepspeed.utils.lazy_exports import lazy_exports  # noqa: E402

# submodules load on first attribute access (`deepspeed.x.y.z` after a plain `import deepspeed`)
__getattr__, __dir__ = lazy_exports(__name__)
