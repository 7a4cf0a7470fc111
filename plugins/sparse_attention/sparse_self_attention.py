"""``SparseSelfAttention``: softmax(Q K^T * scale + masks) V computed on a sparsity pattern's
blocks only. On the torch path (CPU, and on a GPU with ``backend="torch"`` for unmasked fp16/bf16
inputs) that is the fused row-group attention of ``row_groups.py`` (one flash-attention call per
stack of query rows sharing their key blocks); with Triton (CUDA), or ``backend="blocked"``, it
is three block-sparse ops (``sdd`` scores, ``Softmax``, ``dsd`` context).

The layout is made once for ``max_seq_length`` and cut to each input's length (the pattern's
top-left corner), so one module serves every length up to the maximum that is a multiple of
the block. Patterns with random blocks differ between processes unless seeded alike, so on
first use the layout is broadcast from global rank 0 when ``deepspeed.comm`` is initialised:
every data-parallel replica then computes the same function.
"""
import torch
from torch import nn

from deepspeed.sparse_attention import row_groups
from deepspeed.sparse_attention.backend import check_backend, kernels_for
from deepspeed.sparse_attention.layout_index import BlockLayout
from deepspeed.sparse_attention.matmul import MatMul
from deepspeed.sparse_attention.softmax import MASK_MODES, Softmax, additive_mask
from deepspeed.sparse_attention.sparsity_config import SparsityConfig


def _squeeze_mask(mask, name, dims):
    """Drop the broadcast dimensions HF-style masks carry (``[B, 1, 1, S]`` -> ``[B, S]``)."""
    while mask.dim() > dims and mask.shape[1] == 1:
        mask = mask.squeeze(1)
    if mask.dim() != dims:
        raise ValueError(f"{name} must have {dims} dimensions (after dropping size-1 ones), got "
                         f"shape {list(mask.shape)}")
    return mask


class SparseSelfAttention(nn.Module):
    """Block-sparse self-attention over ``[batch, heads, seq, head_dim]`` query/key/value."""

    def __init__(self, sparsity_config=None, key_padding_mask_mode="add", attn_mask_mode="mul",
                 max_seq_length=2048, backend=None):
        super().__init__()
        if sparsity_config is None:
            raise ValueError("SparseSelfAttention needs a sparsity_config (e.g. "
                             "FixedSparsityConfig(num_heads=...))")
        if not isinstance(sparsity_config, SparsityConfig):
            raise TypeError(f"sparsity_config must be a SparsityConfig, got "
                            f"{type(sparsity_config).__name__}")
        for name, mode in (("key_padding_mask_mode", key_padding_mask_mode),
                           ("attn_mask_mode", attn_mask_mode)):
            if mode not in MASK_MODES:
                raise NotImplementedError(f"{name}={mode!r} is not supported; allowed: "
                                          f"{', '.join(MASK_MODES)}")
        self.sparsity_config = sparsity_config
        self.key_padding_mask_mode = key_padding_mask_mode
        self.attn_mask_mode = attn_mask_mode
        self.max_seq_length = max_seq_length
        self.backend = backend
        self.register_buffer("master_layout", sparsity_config.make_layout(max_seq_length),
                             persistent=False)
        self._need_layout_synchronization = True
        self._ops = {}

    def _synchronize_layout(self):
        import deepspeed.comm as dist

        if self._need_layout_synchronization and dist.is_initialized():
            layout = self.master_layout.cpu() if dist.get_backend() == "gloo" else self.master_layout
            dist.broadcast(layout, src=0)
            self.master_layout.copy_(layout)
            self._ops.clear()
        self._need_layout_synchronization = False

    def get_layout(self, seq_len):
        self._synchronize_layout()
        block = self.sparsity_config.block
        if seq_len % block != 0:
            raise ValueError(f"Sequence Length, {seq_len}, needs to be dividable by Block size "
                             f"{block}! Pad the input with SparseAttentionUtils.pad_to_block_size.")
        if seq_len > self.max_seq_length:
            raise ValueError(f"Sequence Length, {seq_len}, is longer than this module's "
                             f"max_seq_length {self.max_seq_length}")
        blocks = seq_len // block
        return self.master_layout[..., :blocks, :blocks].cpu()

    def get_ops(self, heads, seq_len):
        if heads != self.sparsity_config.num_heads:
            raise ValueError(f"the input has {heads} attention heads but the sparsity config was "
                             f"made for num_heads={self.sparsity_config.num_heads}")
        key = (heads, seq_len)
        if key not in self._ops:
            block = self.sparsity_config.block
            layout = BlockLayout(self.get_layout(seq_len), block)
            self._ops[key] = (MatMul(layout, block, "sdd", trans_a=False, trans_b=True, backend=self.backend),
                              MatMul(layout, block, "dsd", backend=self.backend),
                              Softmax(layout, block, backend=self.backend))
        return self._ops[key]

    def forward(self, query, key, value, rpe=None, key_padding_mask=None, attn_mask=None):
        if query.dim() != 4:
            raise ValueError(f"query must be [batch, heads, seq, head_dim], got {list(query.shape)}")
        if query.shape != key.shape or key.shape != value.shape:
            raise NotImplementedError(f"only self-attention is supported: query, key and value "
                                      f"must have one shape, got {list(query.shape)}, "
                                      f"{list(key.shape)}, {list(value.shape)}")
        _, heads, seq_len, head_dim = query.shape
        sdd, dsd, softmax = self.get_ops(heads, seq_len)
        if key_padding_mask is not None:
            key_padding_mask = _squeeze_mask(key_padding_mask, "key_padding_mask", 2)
        if attn_mask is not None:
            attn_mask = _squeeze_mask(attn_mask, "attn_mask", 2)
        scale = float(head_dim) ** -0.5
        masked = rpe is not None or key_padding_mask is not None or attn_mask is not None
        if self._runs_row_groups(query, masked):
            return self._row_groups(query, key, value, softmax, row_groups.plan(softmax.layout),
                                    scale, rpe, key_padding_mask, attn_mask)
        scores = sdd(query, key)
        probs = softmax(scores, scale=scale, rpe=rpe,
                        key_padding_mask=key_padding_mask, attn_mask=attn_mask,
                        key_padding_mask_mode=self.key_padding_mask_mode,
                        attn_mask_mode=self.attn_mask_mode)
        return dsd(probs, value)

    def _runs_row_groups(self, query, masked):
        """The fused row-group path: on CPU wherever the torch kernels run; on a GPU with
        ``backend="torch"`` for inputs torch's flash kernel takes (``row_groups.cuda_eligible``)."""
        backend = check_backend(self.backend)
        if backend == "blocked":
            return False
        if query.device.type == "cpu":
            return kernels_for(query, self.backend).__name__.endswith("torch_kernels")
        return backend == "torch" and row_groups.cuda_eligible(query, masked)

    def _row_groups(self, query, key, value, softmax, classes, scale, rpe, key_padding_mask,
                    attn_mask):
        """The fused row-group path (``row_groups.py``): same checks and mask conversion as
        ``Softmax``, then one SDPA call per stack of equal row groups."""
        L = softmax.layout
        z, _, s, _ = query.shape
        if rpe is not None:
            rpe = rpe.expand(L.heads, s, s) if rpe.dim() == 2 else softmax._check("rpe", rpe, (L.heads, s, s))
        key_padding = softmax._check("key_padding_mask", key_padding_mask, (z, s))
        attn = softmax._check("attn_mask", attn_mask, (s, s))
        key_padding = additive_mask(key_padding, self.key_padding_mask_mode, "key_padding_mask")
        attn = additive_mask(attn, self.attn_mask_mode, "attn_mask")
        return row_groups.attention(query, key, value, L, classes, scale, rpe, key_padding, attn)
