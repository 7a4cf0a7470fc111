"""Plain-PyTorch references for the transformer-kernel tests: HF ``BertLayer`` (Post-LN) with
weights copied from a ``DeepSpeedTransformerLayer``, and a Pre-LN layer written out op by op."""
import torch
import torch.nn.functional as F


def hf_bert_layer(ds_layer):
    from transformers import BertConfig
    from transformers.models.bert.modeling_bert import BertLayer

    c = ds_layer.config
    cfg = BertConfig(hidden_size=c.hidden_size, num_attention_heads=c.heads,
                     intermediate_size=c.intermediate_size, hidden_act="gelu",
                     hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                     layer_norm_eps=c.layer_norm_eps)
    cfg._attn_implementation = "eager"
    layer = BertLayer(cfg).eval()
    h = c.hidden_size
    att = layer.attention
    with torch.no_grad():
        for i, lin in enumerate((att.self.query, att.self.key, att.self.value)):
            lin.weight.copy_(ds_layer.attn_qkvw[i * h:(i + 1) * h])
            lin.bias.copy_(ds_layer.attn_qkvb[i * h:(i + 1) * h])
        pairs = [(att.output.dense, "attn_ow", "attn_ob"), (att.output.LayerNorm, "attn_nw", "attn_nb"),
                 (layer.intermediate.dense, "inter_w", "inter_b"), (layer.output.dense, "output_w", "output_b"),
                 (layer.output.LayerNorm, "norm_w", "norm_b")]
        for mod, w, b in pairs:
            mod.weight.copy_(getattr(ds_layer, w))
            mod.bias.copy_(getattr(ds_layer, b))
    return layer


def hf_grads(layer, h):
    """HF grads renamed to the DeepSpeed parameter names (q/k/v stacked)."""
    att = layer.attention
    qkv = (att.self.query, att.self.key, att.self.value)
    grads = {"attn_qkvw": torch.cat([m.weight.grad for m in qkv]),
             "attn_qkvb": torch.cat([m.bias.grad for m in qkv])}
    pairs = [(att.output.dense, "attn_ow", "attn_ob"), (att.output.LayerNorm, "attn_nw", "attn_nb"),
             (layer.intermediate.dense, "inter_w", "inter_b"), (layer.output.dense, "output_w", "output_b"),
             (layer.output.LayerNorm, "norm_w", "norm_b")]
    for mod, w, b in pairs:
        grads[w], grads[b] = mod.weight.grad, mod.bias.grad
    return grads


def pre_ln_reference(p, x, mask, heads, eps):
    """Pre-LN BERT layer: x + Attn(LN_a(x)), then + FFN(LN_f(.)); ``p`` maps DeepSpeed names."""
    b, s, h = x.shape
    d = h // heads
    a = F.layer_norm(x, (h,), p["attn_nw"], p["attn_nb"], eps)
    q, k, v = (F.linear(a, p["attn_qkvw"][i * h:(i + 1) * h], p["attn_qkvb"][i * h:(i + 1) * h])
               .view(b, s, heads, d).transpose(1, 2) for i in range(3))
    scores = q @ k.transpose(-1, -2) / d ** 0.5
    if mask is not None:
        scores = scores + mask
    ctx = (scores.softmax(-1) @ v).transpose(1, 2).reshape(b, s, h)
    x = x + F.linear(ctx, p["attn_ow"], p["attn_ob"])
    f = F.layer_norm(x, (h,), p["norm_w"], p["norm_b"], eps)
    return x + F.linear(F.gelu(F.linear(f, p["inter_w"], p["inter_b"])), p["output_w"], p["output_b"])
