"""FPDT (Fully Pipelined Distributed Transformer, "Ulysses-Offload"): ``deepspeed.sequence.fpdt_layer``.

FPDT runs a transformer layer over a long sequence chunk by chunk, on top of Ulysses sequence
parallelism:

- :class:`FPDT_InputConstruct` lays the tokens out so that every rank holds, for each global
  chunk of ``chunk_size`` tokens, its ``chunk_size/sp`` slice of it (rank ``r`` holds slice ``r``
  of chunk 0, then slice ``r`` of chunk 1, ...). One all-to-all per chunk then gives each rank
  the whole chunk for ``heads/sp`` heads.
- :class:`FPDT_Attention` (Megatron layout ``[seq, batch, hidden]``, fused QKV weight) projects,
  all-to-alls and rotates one chunk at a time, runs causal attention chunk by chunk with
  online-softmax (LSE) merging (:func:`update_out_and_lse`, exact), optionally keeping the
  chunks not in use in host memory behind a double buffer, and all-to-alls each output chunk back.
- :class:`FPDT_FFN` and :class:`FPDT_LogitsLoss` run the MLP and the vocabulary projection +
  cross-entropy one chunk at a time, recomputing each chunk in backward, so no full-sequence
  MLP intermediate or logits tensor exists.

:class:`FPDTChunkedAttention` is the same chunked attention for callers that bring their own
projections (q, k, v ``[batch, seq/sp, heads, dim]`` in contiguous slices).

Not supported: attention masks other than causal, dropout inside attention, grouped-query
weights in :class:`FPDT_Attention` (use the HF path, which handles GQA, for those models).
"""
import math

import torch
import torch.nn.functional as F

from deepspeed import comm as dist
from deepspeed.sequence.all_to_all import seq_all_to_all
from deepspeed.sequence.fpdt_core import (check_fpdt_sizes, chunked_causal_attention,
                                          shard_sequence, update_out_and_lse)
from deepspeed.sequence.offload import ChunkOffloader
from deepspeed.sequence.tiling import TiledMLP, sequence_tiled_compute

__all__ = ["FPDT_InputConstruct", "FPDT_Attention", "FPDT_FFN", "FPDT_LogitsLoss",
           "FPDTChunkedAttention", "update_out_and_lse", "chunked_causal_attention",
           "ChunkOffloader", "check_fpdt_sizes", "shard_sequence", "fpdt_local_indices",
           "rotary_pos_emb", "apply_rotary_pos_emb"]


def _require_group(group, who):
    if group is None:
        raise ValueError(f"{who} needs a sequence-parallel process group (Ulysses groups, e.g. "
                         "parallel_state_sp.get_sequence_parallel_group()), got None")


def _check_chunk_split(chunk_size, sp_size):
    if chunk_size % sp_size != 0:
        raise ValueError(f"FPDT chunk_size {chunk_size} is not divisible by the sequence-parallel "
                         f"size {sp_size}: each rank holds chunk_size/sp tokens of every chunk")


def fpdt_local_indices(seq_len, chunk_size, sp_size, sp_rank, device=None):
    """Global positions held by ``sp_rank``: slice ``sp_rank`` of every chunk, in chunk order."""
    check_fpdt_sizes(seq_len, chunk_size, sp_size)
    _check_chunk_split(chunk_size, sp_size)
    if not 0 <= sp_rank < sp_size:
        raise ValueError(f"sp_rank {sp_rank} is outside 0..{sp_size - 1}")
    local = chunk_size // sp_size
    starts = torch.arange(0, seq_len, chunk_size, device=device) + sp_rank * local
    return (starts[:, None] + torch.arange(local, device=device)[None, :]).reshape(-1)


class FPDT_InputConstruct(torch.nn.Module):
    """``FPDT_InputConstruct(tokens, labels, loss_mask, attention_mask, position_ids, args,
    sp_size, sp_rank).generate()`` returns this rank's ``(tokens, labels, loss_mask,
    attention_mask, position_ids)``: every ``[batch, seq]`` tensor reduced to the positions of
    :func:`fpdt_local_indices`. ``args`` is the chunk size or an object with
    ``ds_sequence_parallel_fpdt_chunk_size`` (Megatron's parsed arguments). ``position_ids`` of
    ``None`` become the global positions; ``attention_mask`` is passed through (FPDT attention is
    causal and ignores it)."""

    def __init__(self, tokens, labels, loss_mask, attention_mask, position_ids, args, sp_size,
                 sp_rank):
        super().__init__()
        chunk = args if isinstance(args, int) else getattr(
            args, "ds_sequence_parallel_fpdt_chunk_size", None)
        if chunk is None:
            raise ValueError("FPDT_InputConstruct: args must be the chunk size or carry "
                             "ds_sequence_parallel_fpdt_chunk_size")
        if tokens.dim() != 2:
            raise ValueError(f"FPDT_InputConstruct wants tokens [batch, seq], got "
                             f"{tuple(tokens.shape)}")
        self.tokens, self.labels, self.loss_mask = tokens, labels, loss_mask
        self.attention_mask, self.position_ids = attention_mask, position_ids
        self.chunk_size, self.sp_size, self.sp_rank = chunk, sp_size, sp_rank
        self.global_seq_len = tokens.shape[1]
        self.index = fpdt_local_indices(self.global_seq_len, chunk, sp_size, sp_rank,
                                        device=tokens.device)

    def _local(self, t):
        if t is None:
            return None
        if t.dim() < 2 or t.shape[-1] != self.global_seq_len:
            raise ValueError(f"FPDT_InputConstruct: a [batch, seq] tensor has shape "
                             f"{tuple(t.shape)}, sequence length {self.global_seq_len} expected")
        return t.index_select(t.dim() - 1, self.index.to(t.device))

    def generate(self):
        position_ids = self.position_ids
        if position_ids is None:
            position_ids = torch.arange(self.global_seq_len, device=self.tokens.device)[None]
        return (self._local(self.tokens), self._local(self.labels), self._local(self.loss_mask),
                self.attention_mask, self._local(position_ids))


def rotary_pos_emb(seq_len, dim, theta=10000.0, device=None):
    """Megatron's rotary table ``[seq, 1, 1, dim]``: angles ``pos / theta**(2i/dim)``, repeated
    for both halves. ``dim`` is ``head_dim * rotary_percent`` (rounded to an even number)."""
    if dim < 2 or dim % 2:
        raise ValueError(f"rotary dim must be an even int >= 2, got {dim}")
    inv_freq = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.float64, device=device) / dim))
    freqs = torch.outer(torch.arange(seq_len, dtype=torch.float64, device=device), inv_freq)
    return torch.cat([freqs, freqs], dim=-1)[:, None, None, :]


def apply_rotary_pos_emb(t, freqs):
    """Rotate the first ``freqs.shape[-1]`` channels of ``t`` ``[seq, batch, heads, dim]``
    (rotate-half convention); the remaining channels (``rotary_percent < 1``) pass through."""
    rot = freqs.shape[-1]
    if rot > t.shape[-1]:
        raise ValueError(f"rotary dim {rot} is larger than the head dim {t.shape[-1]}")
    x, rest = t[..., :rot], t[..., rot:]
    x1, x2 = x.chunk(2, dim=-1)
    cos, sin = freqs.cos().to(t.dtype), freqs.sin().to(t.dtype)
    x = x * cos + torch.cat([-x2, x1], dim=-1) * sin
    return torch.cat([x, rest], dim=-1)


class FPDT_Attention(torch.nn.Module):
    """Megatron self-attention, FPDT style. ``first_weight`` ``[3*hidden, hidden]`` is the fused
    QKV projection (per head ``[q, k, v]``, Megatron's ``query_key_value`` layout),
    ``second_weight`` ``[hidden, hidden]`` the output projection. ``config`` gives
    ``num_attention_heads``, ``hidden_size`` and optionally ``kv_channels`` (head dim).

    ``forward(hidden_states [seq/sp, batch, hidden], rotary_pos_emb=None)`` takes the rank's
    :class:`FPDT_InputConstruct` layout and returns ``(output, second_bias)`` (Megatron's
    bias-add-later convention) or, with ``return_bias=False``, ``output + second_bias``.
    ``rotary_pos_emb`` is the global table ``[seq, 1, 1, rot_dim]`` (:func:`rotary_pos_emb`).
    ``chunk_size`` counts tokens of the global sequence per chunk.
    """

    def __init__(self, config, first_weight, first_bias, second_weight, second_bias,
                 sequence_process_group, gather_idx=0, scatter_idx=2, return_bias=True,
                 chunk_size=65536, enable_offloading=True):
        super().__init__()
        _require_group(sequence_process_group, "FPDT_Attention")
        if (gather_idx, scatter_idx) != (0, 2):
            raise ValueError(f"FPDT_Attention works on Megatron's [seq, batch, heads, dim] layout: "
                             f"gather_idx=0, scatter_idx=2 (got {gather_idx}, {scatter_idx})")
        self.heads = config.num_attention_heads
        self.head_dim = getattr(config, "kv_channels", None) or config.hidden_size // self.heads
        if first_weight.shape[0] != 3 * self.heads * self.head_dim:
            raise ValueError(f"FPDT_Attention: first_weight has {first_weight.shape[0]} rows, "
                             f"3 * heads * head_dim = {3 * self.heads * self.head_dim} expected "
                             f"(fused QKV, no grouped-query attention)")
        self.first_weight, self.first_bias = first_weight, first_bias
        self.second_weight, self.second_bias = second_weight, second_bias
        self.spg, self.return_bias = sequence_process_group, return_bias
        self.chunk_size, self.offload = chunk_size, enable_offloading

    def _qkv_chunk(self, x, group, freqs):
        s, b = x.shape[:2]
        qkv = F.linear(x, self.first_weight, self.first_bias).view(s, b, self.heads, 3 * self.head_dim)
        q, k, v = (seq_all_to_all(t.contiguous(), group, 2, 0) for t in qkv.split(self.head_dim, -1))
        if freqs is not None:
            q, k = apply_rotary_pos_emb(q, freqs), apply_rotary_pos_emb(k, freqs)
        return q, k, v

    def forward(self, hidden_states, rotary_pos_emb=None):
        sp = dist.get_world_size(group=self.spg)
        local, batch = hidden_states.shape[:2]
        seq, chunk = local * sp, self.chunk_size
        if self.heads % sp != 0:
            raise ValueError(f"FPDT attention heads {self.heads} are not divisible by the "
                             f"sequence-parallel size {sp}")
        check_fpdt_sizes(seq, chunk, sp)
        _check_chunk_split(chunk, sp)
        if rotary_pos_emb is not None and rotary_pos_emb.shape[0] < seq:
            raise ValueError(f"rotary_pos_emb covers {rotary_pos_emb.shape[0]} positions, the "
                             f"sequence has {seq}")
        per_rank, n = chunk // sp, seq // chunk
        pieces = [self._qkv_chunk(hidden_states[i * per_rank:(i + 1) * per_rank], self.spg,
                                  None if rotary_pos_emb is None
                                  else rotary_pos_emb[i * chunk:(i + 1) * chunk])
                  for i in range(n)]
        q, k, v = (torch.cat(parts, 0).transpose(0, 1) for parts in zip(*pieces))
        context = chunked_causal_attention(q, k, v, chunk, offload=self.offload).transpose(0, 1)
        outs = []
        for i in range(n):
            piece = seq_all_to_all(context[i * chunk:(i + 1) * chunk].contiguous(), self.spg, 0, 2)
            outs.append(F.linear(piece.reshape(per_rank, batch, -1), self.second_weight))
        out = torch.cat(outs, 0)
        if self.return_bias:
            return out, self.second_bias
        return out if self.second_bias is None else out + self.second_bias


class FPDT_FFN(torch.nn.Module):
    """Megatron MLP ``second(act(first(x)))`` over ``[seq, batch, hidden]`` run ``chunk_size``
    tokens at a time, each chunk recomputed in backward (:class:`TiledMLP`): the
    ``[seq, batch, ffn_hidden]`` intermediate never exists for the whole sequence. Returns the
    output including ``second_bias``."""

    def __init__(self, first_weight, first_bias, second_weight, second_bias, chunk_size,
                 activation=F.gelu):
        super().__init__()
        if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
            raise ValueError(f"FPDT_FFN chunk_size must be a positive int, got {chunk_size!r}")
        self.first_weight, self.first_bias = first_weight, first_bias
        self.second_weight, self.second_bias = second_weight, second_bias
        self.chunk_size, self.activation = chunk_size, activation

    def _params(self):
        return [p for p in (self.first_weight, self.first_bias, self.second_weight,
                            self.second_bias) if p is not None]

    @staticmethod
    def _mlp(self, x):
        h = self.activation(F.linear(x, self.first_weight, self.first_bias))
        return F.linear(h, self.second_weight, self.second_bias)

    def forward(self, x):
        shards = max(1, math.ceil(x.shape[0] / self.chunk_size))
        out = TiledMLP.apply(FPDT_FFN._mlp, self, x.transpose(0, 1), shards, self._params())
        return out.transpose(0, 1)


class FPDT_LogitsLoss(torch.nn.Module):
    """Per-token cross-entropy of ``lm_output`` ``[seq, batch, hidden]`` against ``labels``
    ``[batch, seq]`` through the vocabulary projection ``logit_weights`` ``[vocab, hidden]``,
    ``chunk_size`` tokens at a time: returns the ``[batch, seq]`` losses (float32 at least) (Megatron's
    ``post_language_model_processing`` output, to be weighted by the loss mask) while at most
    one chunk of logits exists, in forward and in backward."""

    def __init__(self, chunk_size):
        super().__init__()
        if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
            raise ValueError(f"FPDT_LogitsLoss chunk_size must be a positive int, got "
                             f"{chunk_size!r}")
        self.chunk_size = chunk_size

    def forward(self, lm_output, labels, logit_weights):
        seq, batch = lm_output.shape[:2]
        if tuple(labels.shape) != (batch, seq):
            raise ValueError(f"FPDT_LogitsLoss: labels {tuple(labels.shape)} do not match "
                             f"lm_output [seq={seq}, batch={batch}, hidden]")

        def loss(x, y):
            logits = F.linear(x, logit_weights)
            logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
            return F.cross_entropy(logits.transpose(1, 2), y, reduction="none")

        shards = max(1, math.ceil(seq / self.chunk_size))
        params = [logit_weights] if logit_weights.requires_grad else []
        return sequence_tiled_compute(loss, seq, shards, {"x": lm_output.transpose(0, 1),
                                                          "y": labels}, {}, "x",
                                      compute_params=params, output_reduction=None)


class FPDTChunkedAttention(torch.nn.Module):
    """Ulysses all-to-all + chunked causal attention: each rank holds ``[batch, seq/sp, heads,
    dim]`` slices of q, k, v; one all-to-all gives ``[batch, seq, heads/sp, dim]``, the chunked
    attention runs over the whole sequence, and the inverse all-to-all restores the slice
    layout. ``chunk_size`` counts tokens of the whole sequence."""

    def __init__(self, sequence_process_group, chunk_size, offload=False, softmax_scale=None):
        super().__init__()
        _require_group(sequence_process_group, "FPDTChunkedAttention")
        self.spg, self.chunk_size = sequence_process_group, chunk_size
        self.offload, self.softmax_scale = offload, softmax_scale

    def forward(self, query, key, value):
        sp = dist.get_world_size(group=self.spg)
        heads = query.shape[2]
        if heads % sp != 0:
            raise ValueError(f"FPDT attention heads {heads} are not divisible by the "
                             f"sequence-parallel size {sp}")
        check_fpdt_sizes(query.shape[1] * sp, self.chunk_size, sp)
        q, k, v = (seq_all_to_all(t, self.spg, 2, 1) for t in (query, key, value))
        out = chunked_causal_attention(q, k, v, self.chunk_size, self.softmax_scale, self.offload)
        return seq_all_to_all(out, self.spg, 1, 2)
