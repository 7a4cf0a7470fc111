"""``DominoTransformerLayer`` and ``DominoTransformer``: a Megatron-style (Pre-LN, GPT)
tensor-parallel transformer whose all-reduces hide behind computation.

Each layer cuts its batch into ``num_chunks`` pieces (2 by default) and interleaves them so
that the all-reduce that ends a block of one piece travels while the other piece computes:

    attention(c0) -> launch AR(c0)
    attention(c1) -> launch AR(c1)        | AR(c0) in flight
    wait AR(c0); mlp(c0) -> launch AR'(c0) | AR(c1) in flight
    wait AR(c1); mlp(c1) -> launch AR'(c1) | AR'(c0) in flight
    (next layer) wait AR'(c0); attention(c0) ... | AR'(c1) in flight

Layers pass ``PendingAllReduce`` handles to each other, so the last all-reduce of a layer
overlaps the first piece of the next one. ``hidden_chunks`` > 1 also cuts each row-parallel
product along its output (hidden) features, launching each slice's all-reduce before the next
slice is computed (same bytes in all, every element the same dot product). Backward overlaps the input-gradient all-reduce of
every column-parallel Linear with its weight-gradient matmul (``layers``).

Every piece goes through the same arithmetic as plain tensor parallelism (the batch rows do
not interact before the loss), so the result equals it; ``overlap=False`` runs the same
schedule with blocking all-reduces (the non-overlapped reference, bit for bit the same
numbers). Activations are batch-first ``[batch, seq, hidden]``.
"""
import torch
import torch.nn.functional as F
from torch import nn

from deepspeed import comm as dist
from deepspeed.domino.config import DominoConfig, tensor_parallel_group, tensor_parallel_unit
from deepspeed.domino.layers import DominoAsyncColumnParallelLinear, RowParallelLinearNoComm
from deepspeed.domino.overlap import PendingAllReduce, Ready, traced_compute


def split_batch(tensor, num_chunks):
    """``tensor`` cut along dim 0 into ``min(num_chunks, batch)`` nearly equal pieces."""
    return list(torch.tensor_split(tensor, max(1, min(num_chunks, tensor.shape[0])), dim=0))


def _mask_chunks(mask, chunks):
    if mask is None or mask.dim() < 3 or mask.shape[0] == 1:
        return [mask] * len(chunks)
    sizes = [c.shape[0] for c in chunks]
    return list(torch.split(mask, sizes, dim=0))


def _check_chunks(value, name):
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive int (1: no split, 2: halves), got {value!r}")
    return value


class _Block(nn.Module):
    """A named holder for the Linears of one block (Megatron's parameter names)."""


class DominoTransformerLayer(nn.Module):
    """One Pre-LN transformer layer split over the tensor-parallel group (this rank holds
    ``num_attention_heads / tp`` heads and ``ffn_hidden_size / tp`` MLP columns).

    ``config``: a ``DominoConfig``, dict, or Megatron ``TransformerConfig``; ``mpu``: the
    tensor-parallel unit (default: the one registered by ``init_tensor_parallel_groups``);
    ``num_chunks``: batch pieces (a batch smaller than that runs in fewer); ``hidden_chunks``:
    output-feature pieces of the row-parallel products; ``overlap=False``: the same schedule
    with blocking all-reduces.
    Without tensor parallelism (no unit, size 1) construction fails with the fix named."""

    def __init__(self, config, mpu=None, layer_number=1, num_chunks=2, overlap=True,
                 hidden_chunks=1):
        super().__init__()
        config = DominoConfig.coerce(config)
        unit = tensor_parallel_unit(mpu)
        group = tensor_parallel_group(unit)
        tp = dist.get_world_size(group=group)
        for name, value in (("num_attention_heads", config.num_attention_heads),
                            ("ffn_hidden_size", config.ffn_hidden_size)):
            if value % tp:
                raise ValueError(f"{name}={value} is not divisible by the tensor-parallel size "
                                 f"{tp}")
        self.config, self.group, self.layer_number = config, group, layer_number
        self.tensor_parallel_unit = unit  # handed to the engine by the domino plugin
        self.num_chunks, self.overlap = _check_chunks(num_chunks, "num_chunks"), bool(overlap)
        self.hidden_chunks = _check_chunks(hidden_chunks, "hidden_chunks")
        if self.hidden_chunks > config.hidden_size:
            raise ValueError(f"hidden_chunks={hidden_chunks} is more than hidden_size "
                             f"{config.hidden_size}")
        self.local_heads = config.num_attention_heads // tp
        self.head_dim = config.hidden_size // config.num_attention_heads
        h, eps = config.hidden_size, config.layernorm_epsilon

        self.input_layernorm = nn.LayerNorm(h, eps=eps)
        self.self_attention = _Block()
        # fused q/k/v, head-major ([head][q|k|v][head_dim] rows), so a row split keeps heads whole
        self.self_attention.query_key_value = DominoAsyncColumnParallelLinear(
            h, 3 * h, group, overlap=overlap)
        self.self_attention.dense = RowParallelLinearNoComm(h, h, group)
        self.post_attention_layernorm = nn.LayerNorm(h, eps=eps)
        self.mlp = _Block()
        self.mlp.dense_h_to_4h = DominoAsyncColumnParallelLinear(
            h, config.ffn_hidden_size, group, overlap=overlap)
        self.mlp.dense_4h_to_h = RowParallelLinearNoComm(config.ffn_hidden_size, h, group)
        self.self_attention.query_key_value.label = f"layer {layer_number} qkv"
        self.mlp.dense_h_to_4h.label = f"layer {layer_number} h_to_4h"

    # ------------------------------------------------------------- the two blocks, one piece
    def _attention_context(self, x, mask):
        b, s, _ = x.shape
        qkv = self.self_attention.query_key_value(self.input_layernorm(x))
        q, k, v = qkv.view(b, s, self.local_heads, 3, self.head_dim).unbind(3)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        dropout = self.config.attention_dropout if self.training else 0.0
        causal = mask is None and self.config.causal
        context = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout,
                                                 is_causal=causal)
        return context.transpose(1, 2).reshape(b, s, self.local_heads * self.head_dim)

    def _mlp_hidden(self, x):
        return F.gelu(self.mlp.dense_h_to_4h(self.post_attention_layernorm(x)))

    def _epilogue(self, residual, bias):
        def finish(reduced):
            out = reduced + bias
            if self.config.hidden_dropout and self.training:
                out = F.dropout(out, p=self.config.hidden_dropout)
            return residual + out
        return finish

    def _launch(self, row_linear, input, label, epilogue):
        """This piece's row-parallel product, its all-reduce launched (per hidden piece when
        ``hidden_chunks`` > 1, each launched before the next is computed)."""
        pending = PendingAllReduce(self.group, f"layer {self.layer_number} {label}", epilogue,
                                   async_op=self.overlap)
        if self.hidden_chunks == 1:
            return pending.add(row_linear(input))
        for j, partial in enumerate(row_linear.partial_pieces(input, self.hidden_chunks)):
            pending.add(partial, piece=j)
        return pending

    # ------------------------------------------------------------- the interleaved schedule
    def forward_chunks(self, chunks, masks=None):
        """Run the layer over ``chunks`` (``PendingAllReduce`` / ``Ready`` handles of the
        batch pieces, e.g. the previous layer's output); returns the pending outputs."""
        masks = masks or [None] * len(chunks)
        attention = []
        for i, (chunk, mask) in enumerate(zip(chunks, masks)):
            x = chunk.get()
            dense = self.self_attention.dense
            with traced_compute(f"layer {self.layer_number} attention {i}"):
                attention.append(self._launch(dense, self._attention_context(x, mask),
                                              f"attention {i}", self._epilogue(x, dense.bias)))
        outputs = []
        for i, pending in enumerate(attention):
            x = pending.get()
            dense = self.mlp.dense_4h_to_h
            with traced_compute(f"layer {self.layer_number} mlp {i}"):
                outputs.append(self._launch(dense, self._mlp_hidden(x), f"mlp {i}",
                                            self._epilogue(x, dense.bias)))
        return outputs

    def forward(self, hidden_states, attention_mask=None):
        """``hidden_states`` ``[batch, seq, hidden]`` (whole on every tensor-parallel rank);
        ``attention_mask`` optional, as ``scaled_dot_product_attention`` takes it (boolean:
        True may attend), broadcastable to ``[batch, heads, seq, seq]``; None: causal (or
        full when ``config.causal`` is False)."""
        chunks = split_batch(hidden_states, self.num_chunks)
        pending = self.forward_chunks([Ready(c) for c in chunks],
                                      _mask_chunks(attention_mask, chunks))
        return torch.cat([p.get() for p in pending], dim=0)


class DominoTransformer(nn.Module):
    """``config.num_layers`` ``DominoTransformerLayer``s and a final LayerNorm, the batch cut
    into ``num_chunks`` pieces once and the pieces kept in flight from layer to layer."""

    def __init__(self, config, mpu=None, num_chunks=2, overlap=True, post_layer_norm=True,
                 hidden_chunks=1):
        super().__init__()
        config = DominoConfig.coerce(config)
        self.config, self.num_chunks = config, _check_chunks(num_chunks, "num_chunks")
        self.layers = nn.ModuleList(
            DominoTransformerLayer(config, mpu, layer_number=i + 1, num_chunks=num_chunks,
                                   overlap=overlap, hidden_chunks=hidden_chunks)
            for i in range(config.num_layers))
        self.final_layernorm = (nn.LayerNorm(config.hidden_size, eps=config.layernorm_epsilon)
                                if post_layer_norm else None)

    def forward(self, hidden_states, attention_mask=None):
        chunks = split_batch(hidden_states, self.num_chunks)
        masks = _mask_chunks(attention_mask, chunks)
        pending = [Ready(c) for c in chunks]
        for layer in self.layers:
            pending = layer.forward_chunks(pending, masks)
        output = torch.cat([p.get() for p in pending], dim=0)
        return output if self.final_layernorm is None else self.final_layernorm(output)
