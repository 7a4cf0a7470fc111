"""A tiny GPT, its token data and one training worker shared by the ZeRO++ tests (and the
same shape the benchmark uses at a larger size).

The worker trains ``steps`` steps of ZeRO-3 with extra ``zero_optimization`` keys, every
parameter partitioned (persistence threshold 0, so forward and backward really gather), and
returns the per-step losses, the final full weights and the comms logger's summary of one
measured step (the last), so one run answers both "same losses?" and "how many bytes?".
"""
import torch
import torch.nn.functional as F
from torch import nn

# one block: every ZeRO-3 step gathers and reduces each parameter on its own, so the step's
# cost is the parameter count (17 tensors; two blocks had 29 and ran ~1.7x as long); one block
# learns the token stream as fast (a step-20 loss 0.07-0.11 of the first, two blocks 0.06-0.09)
VOCAB, BLOCK, EMBD, HEADS, LAYERS = 32, 8, 32, 2, 1
MICRO = 2


class Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv = nn.Linear(EMBD, 3 * EMBD)
        self.proj = nn.Linear(EMBD, EMBD)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = (z.view(b, t, HEADS, c // HEADS).transpose(1, 2)
                   for z in self.qkv(x).split(c, dim=2))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(b, t, c))


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(EMBD), nn.LayerNorm(EMBD)
        self.attn = Attention()
        self.mlp = nn.Sequential(nn.Linear(EMBD, 4 * EMBD), nn.GELU(), nn.Linear(4 * EMBD, EMBD))

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class TinyGPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.tok = nn.Embedding(VOCAB, EMBD)
        self.pos = nn.Embedding(BLOCK, EMBD)
        self.blocks = nn.ModuleList(Block() for _ in range(LAYERS))
        self.ln = nn.LayerNorm(EMBD)
        self.head = nn.Linear(EMBD, VOCAB, bias=False)

    def forward(self, idx, targets):
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1]))
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.ln(x))
        return F.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1))


def make_gpt(freeze_base=False):
    torch.manual_seed(0)
    model = TinyGPT()
    if freeze_base:  # LoRA-style: frozen base, only the layer norms and head train
        for name, param in model.named_parameters():
            param.requires_grad_(name.startswith("head") or ".ln" in name or name.startswith("ln"))
    return model


def tokens(steps, world, gas=1):
    g = torch.Generator().manual_seed(7)
    # a learnable stream: next token = (token + 1) mod VOCAB with noise-free structure
    start = torch.randint(0, VOCAB, (steps * gas * world * MICRO, 1), generator=g)
    seq = (start + torch.arange(BLOCK + 1)) % VOCAB
    return seq[:, :-1], seq[:, 1:]


def config(zero_extra, gas=1, dtype=None, clip=1.0, lr=1e-2):
    cfg = {"train_micro_batch_size_per_gpu": MICRO, "gradient_accumulation_steps": gas,
           "gradient_clipping": clip,
           "optimizer": {"type": "AdamW", "params": {"lr": lr, "weight_decay": 0.0}},
           "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0,
                                 "reduce_bucket_size": 4000, **zero_extra}}
    if dtype:
        cfg[dtype] = {"enabled": True}
    return cfg


def train(zero_extra, steps, gas=1, dtype=None, freeze_base=False, clip=1.0, lr=1e-2):
    """Worker: (losses, full weights, comms summaries of the last step and of its last backward)."""
    import deepspeed
    from deepspeed import comm as dist

    dist.observers.reset()
    dist.configure({"comms_logger": {"enabled": True}})
    logger = dist.configured_comms_logger()
    from deepspeed.comms_logging import CommsLogger, CommsLoggerConfig

    backward_log = CommsLogger(CommsLoggerConfig(enabled=True))  # the last backward alone
    model = make_gpt(freeze_base)
    engine, _, _, _ = deepspeed.initialize(
        model=model, model_parameters=[p for p in model.parameters() if p.requires_grad],
        config=config(zero_extra, gas, dtype, clip, lr))
    world, rank = dist.get_world_size(), dist.get_rank()
    idx, tgt = tokens(steps, world, gas)
    losses = []
    for step in range(steps):
        if step == steps - 1:
            logger.reset()
        total = 0.0
        for micro in range(gas):
            at = ((step * gas + micro) * world + rank) * MICRO
            loss = engine(idx[at:at + MICRO], tgt[at:at + MICRO])
            if step == steps - 1 and micro == gas - 1:
                dist.add_comm_observer(backward_log)
            engine.backward(loss)
            if step == steps - 1 and micro == gas - 1:
                dist.remove_comm_observer(backward_log)
            engine.step()
            total += loss.item() / gas
        losses.append(total)
    summary = logger.summary()
    weights = {}
    from deepspeed.zero import GatheredParameters

    for name, param in engine.module.named_parameters():
        with GatheredParameters([param]):
            weights[name] = param.detach().float().clone()
    engine.destroy()
    dist.observers.reset()
    return losses, weights, summary, backward_log.summary()
