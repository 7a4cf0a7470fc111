"""A tiny GPT (embedding, transformer stack, LM head) in two builds: the single-process
reference in plain PyTorch and the Domino one over the tensor-parallel group, with the same
parameter names so the reference's state dict loads into Domino (``load_unsplit_state_dict``)."""
import torch
import torch.nn.functional as F
from torch import nn

VOCAB, SEQ, BATCH = 48, 8, 4
SHAPE = dict(hidden_size=32, num_attention_heads=4, ffn_hidden_size=64, num_layers=2)


class _Linears(nn.Module):
    def __init__(self, **linears):
        super().__init__()
        for name, linear in linears.items():
            setattr(self, name, linear)


class ReferenceLayer(nn.Module):
    """The unsplit Pre-LN layer DominoTransformerLayer computes (head-major fused q/k/v)."""

    def __init__(self, hidden_size, num_attention_heads, ffn_hidden_size, **_):
        super().__init__()
        h = hidden_size
        self.heads, self.head_dim = num_attention_heads, h // num_attention_heads
        self.input_layernorm = nn.LayerNorm(h)
        self.self_attention = _Linears(query_key_value=nn.Linear(h, 3 * h), dense=nn.Linear(h, h))
        self.post_attention_layernorm = nn.LayerNorm(h)
        self.mlp = _Linears(dense_h_to_4h=nn.Linear(h, ffn_hidden_size),
                            dense_4h_to_h=nn.Linear(ffn_hidden_size, h))

    def forward(self, x):
        b, s, _ = x.shape
        qkv = self.self_attention.query_key_value(self.input_layernorm(x))
        q, k, v = (t.transpose(1, 2) for t in qkv.view(b, s, self.heads, 3, self.head_dim).unbind(3))
        context = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.self_attention.dense(context.transpose(1, 2).reshape(b, s, -1))
        return x + self.mlp.dense_4h_to_h(F.gelu(self.mlp.dense_h_to_4h(self.post_attention_layernorm(x))))


class ReferenceTransformer(nn.Module):
    def __init__(self, **shape):
        super().__init__()
        self.layers = nn.ModuleList(ReferenceLayer(**shape) for _ in range(shape["num_layers"]))
        self.final_layernorm = nn.LayerNorm(shape["hidden_size"])

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return self.final_layernorm(x)


class TinyGPT(nn.Module):
    def __init__(self, transformer, hidden_size):
        super().__init__()
        self.embedding = nn.Embedding(VOCAB, hidden_size)
        self.transformer = transformer
        self.head = nn.Linear(hidden_size, VOCAB, bias=False)

    def forward(self, ids):
        logits = self.head(self.transformer(self.embedding(ids)))
        return F.cross_entropy(logits[:, :-1].reshape(-1, VOCAB), ids[:, 1:].reshape(-1))


def reference_gpt(seed=0):
    torch.manual_seed(seed)
    model = TinyGPT(ReferenceTransformer(**SHAPE), SHAPE["hidden_size"])
    with torch.no_grad():  # non-zero biases and LayerNorm affines, so every gradient is tested
        for name, param in model.named_parameters():
            if name.endswith("bias") or "layernorm" in name:
                param.add_(torch.randn_like(param) * 0.1)
    return model


def domino_gpt(reference, num_chunks=2, overlap=True, hidden_chunks=1):
    """The Domino build of ``reference``'s weights over the registered tensor-parallel group."""
    from deepspeed.domino import DominoTransformer, load_unsplit_state_dict

    model = TinyGPT(DominoTransformer(SHAPE, num_chunks=num_chunks, overlap=overlap,
                                     hidden_chunks=hidden_chunks),
                    SHAPE["hidden_size"])
    return load_unsplit_state_dict(model, dict(reference.named_parameters()))


def batches(steps):
    gen = torch.Generator().manual_seed(1234)
    return [torch.randint(0, VOCAB, (BATCH, SEQ), generator=gen) for _ in range(steps)]


def rank_slice(model, name, full):
    """This rank's part of the unsplit tensor ``full`` for ``model``'s parameter ``name``."""
    import deepspeed.comm as dist

    param = dict(model.named_parameters())[name]
    if not getattr(param, "tensor_model_parallel", False):
        return full
    return full.chunk(dist.get_world_size(), param.partition_dim)[dist.get_rank()]  # TP = world
