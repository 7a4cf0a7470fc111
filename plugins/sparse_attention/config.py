"""The ``sparse_attention`` config section, and the sparsity pattern it describes.

``mode`` picks the pattern; each mode reads its own keys and ignores the others, so one section
may list every key (as the DeepSpeed docs' example does). A model gets the pattern with
``get_sparse_attention_config(source, num_heads)``, where ``source`` is the engine, a
``DeepSpeedConfig``, the config dict / JSON path, the ``sparse_attention`` dict itself, or
``args`` with ``deepspeed_config`` (the bing_bert convention): the number of heads is the
model's, which the config does not know.
"""
import json
from typing import List, Literal, Optional

from pydantic import ValidationError

from deepspeed.config import DeepSpeedConfigModel
from deepspeed.sparse_attention.sparsity_config import (DenseSparsityConfig, FixedSparsityConfig,
                                                        VariableSparsityConfig)
from deepspeed.sparse_attention.sparsity_patterns import (BigBirdSparsityConfig,
                                                          BSLongformerSparsityConfig)

SECTION = "sparse_attention"
MODE_KEYS = {
    "dense": (),
    "fixed": ("num_local_blocks", "num_global_blocks", "attention", "horizontal_global_attention",
              "num_different_global_patterns"),
    "variable": ("num_random_blocks", "local_window_blocks", "global_block_indices",
                 "global_block_end_indices", "attention", "horizontal_global_attention"),
    "bigbird": ("num_random_blocks", "num_sliding_window_blocks", "num_global_blocks", "attention"),
    "bslongformer": ("num_sliding_window_blocks", "global_block_indices",
                     "global_block_end_indices", "attention"),
}
CLASSES = {"dense": DenseSparsityConfig, "fixed": FixedSparsityConfig,
           "variable": VariableSparsityConfig, "bigbird": BigBirdSparsityConfig,
           "bslongformer": BSLongformerSparsityConfig}


class SparseAttentionConfig(DeepSpeedConfigModel):

    # what each key does here (see deepspeed.config.model): the sparsity config it builds
    tested_by = dict.fromkeys(
        ("mode", "block", "different_layout_per_head", "num_local_blocks", "num_global_blocks",
         "attention", "horizontal_global_attention", "num_different_global_patterns",
         "num_random_blocks", "local_window_blocks", "global_block_indices",
         "global_block_end_indices", "num_sliding_window_blocks"),
        "tests/plugins/sparse_attention/test_sparse_attention_config.py::test_each_mode")
    mode: Literal["dense", "fixed", "variable", "bigbird", "bslongformer"] = "fixed"
    block: int = 16
    different_layout_per_head: bool = False
    num_local_blocks: int = 4
    num_global_blocks: int = 1
    attention: Literal["bidirectional", "unidirectional"] = "bidirectional"
    horizontal_global_attention: bool = False
    num_different_global_patterns: int = 1
    num_random_blocks: int = 0
    local_window_blocks: List[int] = [4]
    global_block_indices: List[int] = [0]
    global_block_end_indices: Optional[List[int]] = None
    num_sliding_window_blocks: int = 3

    def sparsity_config(self, num_heads):
        """The ``SparsityConfig`` of ``mode`` for a model with ``num_heads`` heads; a bad
        combination of keys raises ``ValueError`` naming the section."""
        kwargs = {key: getattr(self, key) for key in MODE_KEYS[self.mode]}
        try:
            return CLASSES[self.mode](num_heads=num_heads, block=self.block,
                                      different_layout_per_head=self.different_layout_per_head,
                                      **kwargs)
        except (ValueError, NotImplementedError) as err:
            raise ValueError(f"{SECTION} (mode {self.mode!r}): {err}") from err


def _section_of(source):
    """The ``sparse_attention`` section (a ``SparseAttentionConfig``) from any config source."""
    if isinstance(source, SparseAttentionConfig):
        return source
    config = getattr(source, "config", None)  # an engine
    if config is not None and hasattr(config, "section"):
        source = config
    if hasattr(source, "section") and hasattr(source, "raw"):  # a DeepSpeedConfig
        section = source.section(SECTION)
        if section is None:
            raise ValueError(f"the DeepSpeed config has no '{SECTION}' section")
        return section
    path = getattr(source, "deepspeed_config", None)  # argparse args
    if path is not None:
        source = path
    if isinstance(source, str):
        with open(source) as f:
            source = json.load(f)
    if not isinstance(source, dict):
        raise TypeError(f"cannot read a '{SECTION}' section from a {type(source).__name__}")
    section = source.get(SECTION, source if "mode" in source or not source else None)
    if section is None:
        raise ValueError(f"the DeepSpeed config has no '{SECTION}' section")
    try:
        return SparseAttentionConfig(**section)
    except ValidationError as err:
        raise ValueError(f"invalid '{SECTION}' section: {err}") from err


def get_sparse_attention_config(source, num_heads):
    """The sparsity pattern the config's ``sparse_attention`` section describes, for
    ``num_heads`` heads."""
    return _section_of(source).sparsity_config(num_heads)
