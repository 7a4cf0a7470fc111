"""Upstream path of ``deepspeed.sparse_attention.sparse_attention_utils``."""
from deepspeed.sparse_attention.sparse_attention_utils import SparseAttentionUtils  # noqa: F401
