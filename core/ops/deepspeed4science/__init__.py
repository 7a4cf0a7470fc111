"""DeepSpeed4Science ops (`deepspeed.ops.deepspeed4science`): ``DS4Sci_EvoformerAttention``."""
from deepspeed.ops.deepspeed4science.evoformer_attn import (DS4Sci_EvoformerAttention,
                                                          evoformer_attention_reference)

__all__ = ["DS4Sci_EvoformerAttention", "evoformer_attention_reference"]

from deepspeed.utils.lazy_exports import lazy_exports  # noqa: E402

# submodules load on first attribute access (`deepspeed.x.y.z` after a plain `import deepspeed`)
__getattr__, __dir__ = lazy_exports(__name__)
