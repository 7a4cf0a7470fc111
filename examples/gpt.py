"""A small GPT (nanoGPT-shaped) and a learnable synthetic token stream, shared by the README demo
(``examples/train_demo.py``) and the engine-vs-DDP benchmark (``tools/bench/engine_vs_ddp.py``)
so both train exactly the same model on exactly the same data.

The model is the textbook decoder: token + learned position embeddings, pre-LayerNorm blocks of
causal self-attention (``scaled_dot_product_attention``) and a GELU MLP, a final LayerNorm and an
LM head tied to the token embedding. No dropout, so two runs of the same steps are bitwise
comparable (the benchmark checks that the engine and DDP end with the same weights).
"""
import math
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F


@dataclass(frozen=True)
class GPTConfig:
    vocab_size: int = 32
    block_size: int = 32
    n_layer: int = 2
    n_head: int = 4
    n_embd: int = 64

    def __post_init__(self):
        for name in ("vocab_size", "block_size", "n_layer", "n_head", "n_embd"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"GPTConfig.{name} must be a positive int, got {value!r}")
        if self.n_embd % self.n_head:
            raise ValueError(f"GPTConfig.n_embd ({self.n_embd}) must be divisible by "
                             f"n_head ({self.n_head})")


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.n_head = cfg.n_head
        self.qkv = nn.Linear(cfg.n_embd, 3 * cfg.n_embd)
        self.proj = nn.Linear(cfg.n_embd, cfg.n_embd)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(x).split(c, dim=2)
        # (b, t, c) -> (b, heads, t, head_dim): the layout scaled_dot_product_attention expects
        q, k, v = (z.view(b, t, self.n_head, c // self.n_head).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).contiguous().view(b, t, c))


class Block(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.n_embd)
        self.attn = CausalSelfAttention(cfg)
        self.ln_2 = nn.LayerNorm(cfg.n_embd)
        self.mlp = nn.Sequential(nn.Linear(cfg.n_embd, 4 * cfg.n_embd), nn.GELU(),
                                 nn.Linear(4 * cfg.n_embd, cfg.n_embd))

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    """``model(idx)`` gives logits ``(b, t, vocab)``; ``model(idx, targets)`` gives the mean
    next-token cross-entropy, the scalar a training loop hands to ``engine.backward``."""

    def __init__(self, cfg=GPTConfig()):
        super().__init__()
        self.cfg = cfg
        self.wte = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        self.wpe = nn.Embedding(cfg.block_size, cfg.n_embd)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.n_embd)
        self.lm_head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)
        self.lm_head.weight = self.wte.weight  # weight tying, as in GPT-2
        self.apply(self._init_weights)
        # GPT-2's scaled init of the residual projections keeps the residual stream's variance
        # from growing with depth
        for name, p in self.named_parameters():
            if name.endswith("attn.proj.weight") or name.endswith("mlp.2.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * cfg.n_layer))

    @staticmethod
    def _init_weights(module):
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def forward(self, idx, targets=None):
        t = idx.size(1)
        if t > self.cfg.block_size:
            raise ValueError(f"sequence length {t} exceeds block_size {self.cfg.block_size}")
        pos = torch.arange(t, device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for block in self.blocks:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        if targets is None:
            return logits
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1))


class MarkovTokens(torch.utils.data.Dataset):
    """Sequences from a fixed random second-order Markov chain: the next token depends on the
    previous two, so the model must attend one position back (a bigram table alone cannot
    predict it). ``entropy`` is the mean entropy of a context's successors: about the loss of
    the perfect predictor, the floor the training loss falls towards from ln(vocab_size).

    Every sample is generated up front from ``seed``, so every rank (and both benchmark
    contestants) sees identical data however the sampler shards it."""

    def __init__(self, samples=4096, seq_len=32, vocab_size=32, branching=2, seed=0):
        if branching < 1 or branching > vocab_size:
            raise ValueError(f"branching must be in [1, vocab_size={vocab_size}], got {branching}")
        g = torch.Generator().manual_seed(seed)
        # each (prev2, prev1) context allows `branching` successors with random weights
        successors = torch.stack([torch.randperm(vocab_size, generator=g)[:branching]
                                  for _ in range(vocab_size * vocab_size)])
        weights = torch.rand(vocab_size * vocab_size, branching, generator=g) + 0.5
        weights /= weights.sum(dim=1, keepdim=True)
        self.entropy = float(-(weights * weights.log()).sum(dim=1).mean())
        tokens = torch.empty(samples, seq_len + 1, dtype=torch.long)
        tokens[:, :2] = torch.randint(vocab_size, (samples, 2), generator=g)
        for t in range(2, seq_len + 1):
            ctx = tokens[:, t - 2] * vocab_size + tokens[:, t - 1]
            pick = torch.multinomial(weights[ctx], 1, generator=g).squeeze(1)
            tokens[:, t] = successors[ctx, pick]
        self.tokens = tokens

    def __len__(self):
        return self.tokens.size(0)

    def __getitem__(self, i):
        row = self.tokens[i]
        return row[:-1], row[1:]
