"""``deepspeed.sparse_attention`` (upstream path ``deepspeed.ops.sparse_attention``): block-sparse
self-attention. Sparsity patterns (``sparsity_config``, ``sparsity_patterns``) make block
layouts; ``MatMul`` and ``Softmax`` compute attention on the layout's blocks only (Triton
kernels on GPU, a blocked torch path on CPU; ``backend``); ``SparseSelfAttention`` and
``BertSparseSelfAttention`` are the modules; ``SparseAttentionUtils`` converts Hugging Face
BERT / RoBERTa models; ``config`` builds a pattern from the ``sparse_attention`` config section.
"""

from deepspeed.utils.lazy_exports import lazy_exports

_EXPORTS = {
    "MatMul": "deepspeed.sparse_attention.matmul",
    "Softmax": "deepspeed.sparse_attention.softmax",
    "SparsityConfig": "deepspeed.sparse_attention.sparsity_config",
    "DenseSparsityConfig": "deepspeed.sparse_attention.sparsity_config",
    "FixedSparsityConfig": "deepspeed.sparse_attention.sparsity_config",
    "VariableSparsityConfig": "deepspeed.sparse_attention.sparsity_config",
    "BigBirdSparsityConfig": "deepspeed.sparse_attention.sparsity_patterns",
    "BSLongformerSparsityConfig": "deepspeed.sparse_attention.sparsity_patterns",
    "LocalSlidingWindowSparsityConfig": "deepspeed.sparse_attention.sparsity_patterns",
    "SparseSelfAttention": "deepspeed.sparse_attention.sparse_self_attention",
    "BertSparseSelfAttention": "deepspeed.sparse_attention.bert_sparse_self_attention",
    "SparseAttentionUtils": "deepspeed.sparse_attention.sparse_attention_utils",
    "SparseAttentionConfig": "deepspeed.sparse_attention.config",
    "get_sparse_attention_config": "deepspeed.sparse_attention.config",
}

__all__ = ["MatMul", "Softmax", "SparsityConfig", "DenseSparsityConfig", "FixedSparsityConfig",
           "VariableSparsityConfig", "BigBirdSparsityConfig", "BSLongformerSparsityConfig",
           "LocalSlidingWindowSparsityConfig", "SparseSelfAttention", "BertSparseSelfAttention",
           "SparseAttentionUtils", "SparseAttentionConfig", "get_sparse_attention_config"]

# loaded on first use: the plugin catalog imports this package with every run (see lazy_exports)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
