"""Upstream module holding every sparsity pattern."""
from deepspeed.sparse_attention.sparsity_config import (DenseSparsityConfig, FixedSparsityConfig,  # noqa: F401
                                                        SparsityConfig, VariableSparsityConfig)
from deepspeed.sparse_attention.sparsity_patterns import (BigBirdSparsityConfig,  # noqa: F401
                                                          BSLongformerSparsityConfig,
                                                          LocalSlidingWindowSparsityConfig)
