"""Upstream path of ``deepspeed.sparse_attention.bert_sparse_self_attention``."""
from deepspeed.sparse_attention.bert_sparse_self_attention import BertSparseSelfAttention  # noqa: F401
