"""Long-context switches for Hugging Face causal LMs (``deepspeed.sequence.alst``).

Three independent memory savings, each a one-line call on a model built from transformers:

- :func:`register_fpdt_attention` registers the FPDT chunked attention (exact causal attention,
  one ``chunk x chunk`` score block at a time, chunks offloaded to the host pool) as a
  transformers attention implementation; pass its name as ``core_attn_implementation`` to
  ``UlyssesSPAttentionHF.register_with_transformers`` (Ulysses + FPDT), or set it as the model's
  ``attn_implementation`` (FPDT alone);
- :func:`tile_mlps` runs every ``*MLP`` module through :class:`~deepspeed.sequence.tiling.TiledMLP`
  (sequence shards, recomputed in backward);
- :func:`tiled_causal_lm_loss` computes the loss from the last hidden states shard by shard
  (:class:`~deepspeed.sequence.tiling.TiledFusedLogitsLoss`), so ``[batch, seq, vocab]`` logits
  never exist: call the base model (``model.model``) for the hidden states.
"""
import torch
import torch.nn.functional as F

from deepspeed.sequence.fpdt_core import check_fpdt_sizes, chunked_causal_attention
from deepspeed.sequence.tiling import TiledFusedLogitsLoss, TiledMLP

FPDT_ATTENTION = "fpdt"
IGNORE_INDEX = -100


class FPDTAttentionHF:
    """A transformers attention function: ``(module, q, k, v, mask, **kw) -> (out, None)`` with
    q/k/v ``[batch, heads, seq, dim]`` (fewer kv heads allowed: they are repeated to the query
    heads) and out ``[batch, seq, heads, dim]``. Causal only; no padding mask, no dropout."""

    def __init__(self, chunk_size, offload=True):
        if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
            raise ValueError(f"FPDT chunk_size must be a positive int, got {chunk_size!r}")
        self.chunk_size, self.offload = chunk_size, offload

    def __call__(self, module, query, key, value, attention_mask, scaling=None, dropout=0.0,
                 **kwargs):
        if attention_mask is not None:
            raise NotImplementedError("FPDT attention is causal over the whole sequence and takes "
                                      "no attention mask: drop attention_mask from the batch")
        if dropout and module.training:
            raise NotImplementedError(f"FPDT attention has no attention dropout (got {dropout})")
        for unsupported in ("sliding_window", "softcap"):
            if kwargs.get(unsupported) is not None:
                raise NotImplementedError(f"FPDT attention is plain causal softmax attention: the "
                                          f"model asks for {unsupported}={kwargs[unsupported]!r}")
        check_fpdt_sizes(query.shape[2], self.chunk_size)
        groups = query.shape[1] // key.shape[1]
        if groups > 1:
            key, value = (t.repeat_interleave(groups, dim=1) for t in (key, value))
        q, k, v = (t.transpose(1, 2) for t in (query, key, value))
        return chunked_causal_attention(q, k, v, self.chunk_size, scaling, self.offload), None


def register_fpdt_attention(chunk_size, offload=True, name=FPDT_ATTENTION):
    """Register :class:`FPDTAttentionHF` with transformers under ``name``; returns ``name``."""
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
    ALL_ATTENTION_FUNCTIONS.register(name, FPDTAttentionHF(chunk_size, offload))
    ALL_MASK_ATTENTION_FUNCTIONS.register(name, _causal_only)
    return name


def _causal_only(*args, attention_mask=None, **kwargs):
    if attention_mask is not None and not bool(attention_mask.all()):
        raise NotImplementedError("FPDT attention does not support padding masks: drop "
                                  "attention_mask and mark padding with labels -100 instead")
    return None


def tile_mlps(model, num_shards=None):
    """Route the forward of every module whose class name ends in ``MLP`` through
    :class:`TiledMLP` (``num_shards=None``: the ALST rule ``ceil(seq/hidden)``, MAX-reduced over
    the ranks). Returns the number of modules patched."""
    patched = 0
    for module in model.modules():
        if type(module).__name__.endswith("MLP") and not getattr(module, "_ds_tiled", False):
            forward = type(module).forward
            module.forward = (lambda m, f: lambda x: TiledMLP.apply(f, m, x, num_shards))(
                module, forward)
            module._ds_tiled = True
            patched += 1
    if not patched:
        raise ValueError(f"tile_mlps: {type(model).__name__} has no module whose class name ends "
                         f"in 'MLP'")
    return patched


def _lm_head_loss_sum(lm_head, x, y):
    logits = lm_head(x)
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1), reduction="sum",
                           ignore_index=IGNORE_INDEX)


def tiled_causal_lm_loss(lm_head, hidden_states, shift_labels, shards):
    """Mean cross-entropy of ``lm_head(hidden_states)`` against ``shift_labels`` (already
    shifted, ``-100`` ignored) over ``shards`` sequence shards: the same value and gradients as
    the full-logits loss, with one shard's logits live at a time. Returns ``(loss, tokens)``,
    ``tokens`` the count of non-ignored labels (weights for a sequence-parallel average)."""
    total = TiledFusedLogitsLoss.apply(_lm_head_loss_sum, lm_head, hidden_states, shift_labels,
                                       None, shards, None, "sum")
    tokens = (shift_labels != IGNORE_INDEX).sum()
    return total / tokens.clamp(min=1), tokens
