"""DeepSpeed4Science ops (`deepspeed.ops.deepspeed4science`): ``DS4Sci_EvoformerAttention``."""
from deepspeed.ops.deepspeed4science.evoformer_attn import (DS4Sci_EvoformerAttention,
                                                          evoformer_attention_reference)

__all__ = ["DS4Sci_EvoformerAttention", "evoformer_attention_reference"]
