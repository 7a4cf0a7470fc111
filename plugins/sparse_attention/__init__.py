"""``deepspeed.sparse_attention`` (upstream path ``deepspeed.ops.sparse_attention``): block-sparse
self-attention. Sparsity patterns (``sparsity_config``, ``sparsity_patterns``) make block
layouts; ``MatMul`` and ``Softmax`` compute attention on the layout's blocks only (Triton
kernels on GPU, a blocked torch path on CPU; ``backend``); ``SparseSelfAttention`` and
``BertSparseSelfAttention`` are the modules; ``SparseAttentionUtils`` converts Hugging Face
BERT / RoBERTa models; ``config`` builds a pattern from the ``sparse_attention`` config section.
"""
from deepspeed.sparse_attention.bert_sparse_self_attention import BertSparseSelfAttention
from deepspeed.sparse_attention.config import SparseAttentionConfig, get_sparse_attention_config
from deepspeed.sparse_attention.matmul import MatMul
from deepspeed.sparse_attention.softmax import Softmax
from deepspeed.sparse_attention.sparse_attention_utils import SparseAttentionUtils
from deepspeed.sparse_attention.sparse_self_attention import SparseSelfAttention
from deepspeed.sparse_attention.sparsity_config import (DenseSparsityConfig, FixedSparsityConfig,
                                                        SparsityConfig, VariableSparsityConfig)
from deepspeed.sparse_attention.sparsity_patterns import (BigBirdSparsityConfig,
                                                          BSLongformerSparsityConfig,
                                                          LocalSlidingWindowSparsityConfig)

__all__ = ["MatMul", "Softmax", "SparsityConfig", "DenseSparsityConfig", "FixedSparsityConfig",
           "VariableSparsityConfig", "BigBirdSparsityConfig", "BSLongformerSparsityConfig",
           "LocalSlidingWindowSparsityConfig", "SparseSelfAttention", "BertSparseSelfAttention",
           "SparseAttentionUtils", "SparseAttentionConfig", "get_sparse_attention_config"]
