"""``DeepSpeedTransformerLayer``: one BERT encoder layer, Pre-LN or Post-LN, with the
documented parameter names, and the memory flags of ``DeepSpeedTransformerConfig``.

The layer is a composition of a few fused blocks. By default (``auto``) the torch blocks of
``torch_ops`` run them on every device: SDPA (flash kernels on a GPU), cuBLAS matmuls with the
bias in their epilogue and torch's fused ``layer_norm``. On an H200 (fp16/bf16, BERT-large layer,
forward + backward) they ran 1.11x / 1.19x HF ``BertLayer``, while our Triton kernels (fused
bias+GeLU, fused residual+LayerNorm, forward and backward) ran 0.89x / 0.79x, so those run only
when asked for (``backend="triton"`` or ``$DS_TRANSFORMER_BACKEND``).

Parameters (H = hidden_size, I = intermediate_size):
``attn_qkvw [3H, H]``, ``attn_qkvb [3H]`` (query, key, value stacked), ``attn_ow [H, H]``,
``attn_ob [H]``, ``attn_nw``/``attn_nb [H]`` (the attention block's LayerNorm: before attention
in Pre-LN, after its residual add in Post-LN), ``inter_w [I, H]``, ``inter_b [I]``,
``output_w [H, I]``, ``output_b [H]``, ``norm_w``/``norm_b [H]`` (the feed-forward block's
LayerNorm, placed likewise).
"""
import importlib

import torch
import torch.nn.functional as F
from torch import nn

from deepspeed.ops.transformer import torch_ops
from deepspeed.ops.transformer.config import DeepSpeedTransformerConfig
from deepspeed.ops.triton_support import chosen_backend, use_triton

BACKEND_ENV = "DS_TRANSFORMER_BACKEND"
_WEIGHTS = ("attn_qkvw", "attn_ow", "attn_nw", "inter_w", "output_w", "norm_w")
_BIASES = ("attn_qkvb", "attn_ob", "attn_nb", "inter_b", "output_b", "norm_b")


class DeepSpeedTransformerLayer(nn.Module):
    """Initialize the DeepSpeed Transformer Layer.

    ``layer_id`` (static) counts the layers built so far: the n-th layer gets ``config.layer_id``
    n - 1. ``initial_weights`` / ``initial_biases`` (for tests) are 8 tensors each, in the order
    query, key, value, attention output, attention LayerNorm, intermediate, output, output
    LayerNorm (HF ``BertLayer`` order); query/key/value are stacked into ``attn_qkvw``/``b``.
    """

    layer_id = 0

    def __init__(self, config, initial_weights=None, initial_biases=None):
        super().__init__()
        if not isinstance(config, DeepSpeedTransformerConfig):
            raise TypeError(f"DeepSpeedTransformerLayer needs a DeepSpeedTransformerConfig, got "
                            f"{type(config).__name__}")
        config.validate()
        self.config = config
        self.config.layer_id = DeepSpeedTransformerLayer.layer_id
        DeepSpeedTransformerLayer.layer_id += 1
        self.backend = None  # None: $DS_TRANSFORMER_BACKEND, else auto
        if config.local_rank >= 0 and torch.cuda.is_available():
            torch.cuda.set_device(config.local_rank)
        h, i = config.hidden_size, config.intermediate_size
        shapes = dict(attn_qkvw=(3 * h, h), attn_qkvb=(3 * h,), attn_ow=(h, h), attn_ob=(h,),
                      attn_nw=(h,), attn_nb=(h,), inter_w=(i, h), inter_b=(i,), output_w=(h, i),
                      output_b=(h,), norm_w=(h,), norm_b=(h,))
        for name, shape in shapes.items():
            setattr(self, name, nn.Parameter(torch.empty(shape)))
        if initial_weights is None and initial_biases is None:
            self.init_transformer_weights(config.adjust_init_range)
        else:
            self._load_initial(initial_weights, initial_biases)
        self._generators = {}
        self.train(config.training)

    def init_transformer_weights(self, adjust_init_range=False):
        std, output_std = self.config.init_stds()
        if not adjust_init_range:
            output_std = std
        with torch.no_grad():
            for name in ("attn_qkvw", "inter_w"):
                getattr(self, name).normal_(0.0, std)
            for name in ("attn_ow", "output_w"):
                getattr(self, name).normal_(0.0, output_std)
            for name in ("attn_nw", "norm_w"):
                getattr(self, name).fill_(1.0)
            for name in _BIASES:
                getattr(self, name).zero_()

    def _load_initial(self, weights, biases):
        if weights is None or biases is None or len(weights) != 8 or len(biases) != 8:
            raise ValueError("initial_weights and initial_biases must both be given, 8 tensors "
                             "each (query, key, value, attention output, attention LayerNorm, "
                             "intermediate, output, output LayerNorm)")
        with torch.no_grad():
            self.attn_qkvw.copy_(torch.cat([w.detach() for w in weights[:3]]))
            self.attn_qkvb.copy_(torch.cat([b.detach() for b in biases[:3]]))
            for name, w in zip(_WEIGHTS[1:], weights[3:]):
                getattr(self, name).copy_(w.detach())
            for name, b in zip(_BIASES[1:], biases[3:]):
                getattr(self, name).copy_(b.detach())

    # ---------------------------------------------------------------------------------------
    def _ops(self, x):
        backend = chosen_backend(self.backend, BACKEND_ENV)
        if backend == "auto":  # the measured-faster blocks (see the module doc)
            return torch_ops
        if use_triton(x, backend, BACKEND_ENV, "transformer kernel"):
            return importlib.import_module("deepspeed.ops.transformer.triton_ops")
        return torch_ops

    def _generator(self, device):
        """The layer's dropout RNG when ``config.seed >= 0`` (None: torch's global RNG)."""
        if self.config.seed < 0:
            return None
        key = str(device)
        if key not in self._generators:
            gen = torch.Generator(device=device)
            gen.manual_seed(self.config.seed + max(self.config.layer_id, 0))
            self._generators[key] = gen
        return self._generators[key]

    def _check_input(self, x):
        h = self.config.hidden_size
        if x.dim() != 3 or x.shape[-1] != h:
            raise ValueError(f"DeepSpeedTransformerLayer: hidden_states must be [batch, seq, "
                             f"hidden_size={h}], got shape {tuple(x.shape)}")
        if x.dtype not in (torch.float32, torch.float16, torch.bfloat16):
            raise ValueError(f"DeepSpeedTransformerLayer: hidden_states dtype {x.dtype} is not "
                             f"supported; allowed: float32, float16, bfloat16")

    @staticmethod
    def _additive_mask(mask, batch, seq, dtype):
        """An additive mask broadcastable to ``[batch, heads, seq, seq]``.

        Accepted: the BERT extended additive mask ``[batch, 1, 1, seq]`` (or any float mask
        broadcastable to ``[batch, heads, seq, seq]``); a bool mask of that rank (True = attend);
        a ``[batch, seq]`` padding mask of 1 (attend) / 0 (padding).
        """
        if mask is None:
            return None
        if mask.dim() == 2:
            if tuple(mask.shape) != (batch, seq):
                raise ValueError(f"attention_mask of rank 2 must be [batch, seq] = {(batch, seq)}, "
                                 f"got {tuple(mask.shape)}")
            mask = mask[:, None, None, :].bool()
        if mask.dim() != 4:
            raise ValueError(f"attention_mask must be [batch, seq] or 4-D broadcastable to [batch, "
                             f"heads, seq, seq], got shape {tuple(mask.shape)}")
        if mask.dtype == torch.bool:
            return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(
                ~mask, torch.finfo(dtype).min)
        return mask.to(dtype)

    def forward(self, hidden_states, attention_mask=None, head_mask=None, layer_head_mask=None,
                encoder_hidden_states=None, encoder_attention_mask=None, past_key_value=None,
                output_attentions=False, grad_input=None, **kwargs):
        unsupported = dict(head_mask=head_mask, layer_head_mask=layer_head_mask,
                           encoder_hidden_states=encoder_hidden_states,
                           encoder_attention_mask=encoder_attention_mask,
                           past_key_value=past_key_value, grad_input=grad_input)
        if kwargs:
            raise TypeError(f"DeepSpeedTransformerLayer.forward got unexpected keyword argument(s) "
                            f"{sorted(kwargs)}")
        given = [k for k, v in unsupported.items() if v is not None] + (
            ["output_attentions"] if output_attentions else [])
        if given:
            raise NotImplementedError(f"DeepSpeedTransformerLayer is an encoder self-attention "
                                      f"layer; {', '.join(given)} is not supported")
        self._check_input(hidden_states)
        out_dtype = hidden_states.dtype
        # no fp16 arithmetic on CPU: half inputs/weights are computed in fp32 there
        dtype = torch.float32 if (hidden_states.device.type == "cpu"
                                  and out_dtype == torch.float16) else out_dtype
        x = hidden_states.to(dtype)
        p = {name: getattr(self, name).to(dtype) for name in _WEIGHTS + _BIASES}
        out = self._layer(x, self._additive_mask(attention_mask, x.shape[0], x.shape[1], dtype),
                          p, self._ops(x)).to(out_dtype)
        return (out, ) if self.config.return_tuple else out

    def _layer(self, x, mask, p, ops):
        cfg = self.config
        batch, seq, hidden = x.shape
        heads = cfg.heads
        p_attn = cfg.dropout("attn_dropout_ratio") if self.training else 0.0
        p_hidden = cfg.dropout("hidden_dropout_ratio") if self.training else 0.0
        gen = self._generator(x.device) if (p_attn or p_hidden) else None
        eps, inv = cfg.layer_norm_eps, cfg.normalize_invertible

        a_in = ops.add_layer_norm(x, None, p["attn_nw"], p["attn_nb"], eps, inv) if cfg.pre_layer_norm else x
        qkv = F.linear(a_in, p["attn_qkvw"], p["attn_qkvb"])
        q, k, v = qkv.view(batch, seq, 3, heads, hidden // heads).permute(2, 0, 3, 1, 4).unbind(0)
        ctx = ops.attention(q, k, v, mask, p_attn, cfg.attn_dropout_checkpoint, cfg.stochastic_mode, gen)
        attn = F.linear(ctx.transpose(1, 2).reshape(batch, seq, hidden), p["attn_ow"], p["attn_ob"])
        if p_hidden:
            attn = torch_ops.dropout(attn, p_hidden, gen)
        if cfg.pre_layer_norm:
            h = attn + x
            f_in = ops.add_layer_norm(h, None, p["norm_w"], p["norm_b"], eps, inv)
        else:
            h = f_in = ops.add_layer_norm(attn, x, p["attn_nw"], p["attn_nb"], eps, inv)

        # the fused Triton path adds the intermediate bias inside its GeLU kernel
        bias = p["inter_b"] if ops.FUSED_BIAS_GELU else None
        z = F.linear(f_in, p["inter_w"], None if ops.FUSED_BIAS_GELU else p["inter_b"])
        if cfg.gelu_checkpoint:
            out = ops.bias_gelu_linear(z, bias, p["output_w"], p["output_b"])
        else:
            out = F.linear(ops.gelu(z, bias), p["output_w"], p["output_b"])
        if p_hidden:
            out = torch_ops.dropout(out, p_hidden, gen)
        if cfg.pre_layer_norm:
            return out + h
        return ops.add_layer_norm(out, h, p["norm_w"], p["norm_b"], eps, inv)
