"""Upstream path of ``deepspeed.sparse_attention.softmax``."""
from deepspeed.sparse_attention.softmax import Softmax  # noqa: F401
