"""A Megatron-style block built from the upstream FPDT modules (FPDT_InputConstruct layout,
FPDT_Attention with rotary, FPDT_FFN, FPDT_LogitsLoss) trains under Ulysses sp=2 x ZeRO-3 like
the same block with dense attention on one process."""
import math

import pytest
import torch
import torch.nn.functional as F

S, HEADS, D, VOCAB, CHUNK, STEPS, LR = 32, 4, 8, 48, 8, 2, 1e-2
# the key bias of the channels rotary leaves alone has an exactly-zero gradient (softmax does not
# see a per-row constant); Adam's default eps would turn its rounding noise into +-lr steps
EPS = 1e-3
H = HEADS * D


class Block(torch.nn.Module):
    """Embedding, pre-LN attention and MLP, vocabulary projection; ``group=None``: dense."""

    def __init__(self, group=None):
        super().__init__()
        from types import SimpleNamespace
        from deepspeed.sequence.fpdt_layer import (FPDT_FFN, FPDT_Attention, FPDT_LogitsLoss,
                                                   rotary_pos_emb)
        torch.manual_seed(0)
        self.emb = torch.nn.Embedding(VOCAB, H)
        self.ln1, self.ln2 = torch.nn.LayerNorm(H), torch.nn.LayerNorm(H)
        self.qkv, self.dense = torch.nn.Linear(H, 3 * H), torch.nn.Linear(H, H)
        self.fc1, self.fc2 = torch.nn.Linear(H, 2 * H), torch.nn.Linear(2 * H, H)
        self.head = torch.nn.Linear(H, VOCAB, bias=False)
        self.register_buffer("freqs", rotary_pos_emb(S, D // 2, theta=1000.0), persistent=False)
        self.group = group
        if group is not None:
            config = SimpleNamespace(num_attention_heads=HEADS, hidden_size=H)
            self.attn = FPDT_Attention(config, self.qkv.weight, self.qkv.bias, self.dense.weight,
                                       self.dense.bias, group, chunk_size=CHUNK)
            self.ffn = FPDT_FFN(self.fc1.weight, self.fc1.bias, self.fc2.weight, self.fc2.bias,
                                CHUNK // 2)
            self.loss = FPDT_LogitsLoss(CHUNK // 2)

    def _dense_attention(self, x):
        from deepspeed.sequence.fpdt_layer import apply_rotary_pos_emb
        s, b = x.shape[:2]
        q, k, v = self.qkv(x).view(s, b, HEADS, 3 * D).split(D, -1)
        q, k = apply_rotary_pos_emb(q, self.freqs), apply_rotary_pos_emb(k, self.freqs)
        scores = torch.einsum("qbhd,kbhd->bhqk", q, k) / math.sqrt(D)
        scores = scores.masked_fill(torch.ones(s, s, dtype=torch.bool).triu(1), float("-inf"))
        return self.dense(torch.einsum("bhqk,kbhd->qbhd", scores.softmax(-1), v).reshape(s, b, H))

    def forward(self, ids, labels):
        """Per-token losses ``[batch, seq]`` (this rank's tokens under FPDT)."""
        x = self.emb(ids).transpose(0, 1)
        if self.group is None:
            h = x + self._dense_attention(self.ln1(x))
            h = h + self.fc2(F.gelu(self.fc1(self.ln2(h))))
            return F.cross_entropy(self.head(h).permute(1, 2, 0), labels, reduction="none")
        out, bias = self.attn(self.ln1(x), rotary_pos_emb=self.freqs)
        h = x + out + bias
        h = h + self.ffn(self.ln2(h))
        return self.loss(h, labels, self.head.weight)


def _data():
    ids = torch.randint(0, VOCAB, (STEPS, 1, S), generator=torch.Generator().manual_seed(2))
    labels = torch.cat([ids[..., 1:], torch.full_like(ids[..., :1], -100)], dim=-1)
    return ids, labels


def _train_fpdt_zero3():
    import deepspeed
    from deepspeed import comm as dist
    from deepspeed.sequence import parallel_state
    from deepspeed.sequence.fpdt_layer import FPDT_InputConstruct
    from deepspeed.zero import GatheredParameters
    parallel_state.initialize_sequence_parallel(2)
    try:
        group = parallel_state.get_sequence_parallel_group()
        model = Block(group)
        config = {"train_micro_batch_size_per_gpu": 1, "sequence_parallel_size": 2,
                  "zero_optimization": {"stage": 3},
                  "optimizer": {"type": "Adam", "params": {"lr": LR, "eps": EPS}}}
        engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                          config=config, mpu=parallel_state)
        rank, losses = parallel_state.get_sequence_parallel_rank(), []
        for ids, labels in zip(*_data()):
            local_ids, local_labels, *_ = FPDT_InputConstruct(ids, labels, None, None, None,
                                                              CHUNK, 2, rank).generate()
            count = (labels != -100).sum()
            # the engine averages over both ranks: each contributes sp x its share of the sum
            loss = engine(local_ids, local_labels).sum() * 2 / count
            engine.backward(loss)
            engine.step()
            total = loss.detach() / 2
            dist.all_reduce(total, group=group)
            losses.append(total.item())
        with GatheredParameters(list(engine.module.parameters())):
            params = {n: p.detach().clone() for n, p in engine.module.named_parameters()}
        engine.destroy()
        return losses, params
    finally:
        parallel_state.destroy_sequence_parallel()


def test_fpdt_block_under_zero3_and_ulysses_trains_like_the_dense_block(dist_pool):
    model = Block()
    opt = torch.optim.Adam(model.parameters(), lr=LR, eps=EPS)
    want = []
    for ids, labels in zip(*_data()):
        opt.zero_grad()
        loss = model(ids, labels).sum() / (labels != -100).sum()
        loss.backward()
        opt.step()
        want.append(loss.item())
    for losses, params in dist_pool.run(_train_fpdt_zero3, world_size=2, timeout=180):
        assert losses == pytest.approx(want, rel=1e-5)
        for name, value in model.named_parameters():
            torch.testing.assert_close(params[name], value.detach(), rtol=1e-4, atol=1e-4,
                                       msg=lambda m, name=name: f"{name}: {m}")
