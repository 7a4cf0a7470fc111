"""Upstream path of ``deepspeed.sparse_attention.sparse_self_attention``."""
from deepspeed.sparse_attention.sparse_self_attention import SparseSelfAttention  # noqa: F401
