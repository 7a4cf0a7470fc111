"""Upstream path of ``deepspeed.sparse_attention.matmul``."""
from deepspeed.sparse_attention.matmul import MatMul  # noqa: F401
