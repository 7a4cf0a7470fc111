"""A model with ``SparseSelfAttention`` (BigBird: random blocks, a layout per head) trained by
the engine on 2 gloo CPU ranks of the shared warm pool (``run_distributed``): the random layout
is broadcast from rank 0 on first use, so the replicas compute one function and stay identical
after reduced steps. No transformers import in the ranks (the BERT conversion is tested in
process by ``test_bert.py``)."""
import pytest

from deepspeed.testing.distributed import run_distributed


def _train_sparse_model(steps):
    import random

    import torch

    import deepspeed
    import deepspeed.comm as dist
    from deepspeed.sparse_attention import SparseSelfAttention, get_sparse_attention_config

    config = {"train_micro_batch_size_per_gpu": 2, "steps_per_print": 10 ** 6,
              "optimizer": {"type": "AdamW", "params": {"lr": 1e-2}},
              "sparse_attention": {"mode": "bigbird", "block": 16, "num_random_blocks": 1,
                                   "different_layout_per_head": True}}

    class Tiny(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = torch.nn.Embedding(50, 32)
            self.qkv = torch.nn.Linear(32, 96)
            # random blocks differ per rank until the module synchronises them
            torch.manual_seed(100 + dist.get_rank())
            random.seed(dist.get_rank())
            self.attn = SparseSelfAttention(get_sparse_attention_config(config, 4),
                                            key_padding_mask_mode="mul", max_seq_length=64)
            self.out = torch.nn.Linear(32, 50)

        def forward(self, ids, keep):
            q, k, v = self.qkv(self.emb(ids)).unflatten(-1, (3, 4, 8)).permute(2, 0, 3, 1, 4)
            ctx = self.attn(q, k, v, key_padding_mask=keep)
            return self.out(ctx.transpose(1, 2).flatten(2))

    model = Tiny()
    torch.manual_seed(0)  # one initialisation on every rank
    for p in model.parameters():
        torch.nn.init.normal_(p, std=0.1)
    engine, *_ = deepspeed.initialize(model=model, config=config, model_parameters=model.parameters())
    rank = dist.get_rank()
    losses = []
    for step in range(steps):
        g = torch.Generator().manual_seed(rank)  # one batch per rank: the loss must fall
        ids = torch.randint(0, 50, (2, 48), generator=g)
        keep = torch.ones(2, 48)
        keep[1, 40:] = 0
        logits = engine(ids, keep)
        loss = torch.nn.functional.cross_entropy(logits[0].reshape(-1, 50), ids[0].reshape(-1))
        engine.backward(loss)
        engine.step()
        losses.append(loss.item())
    return losses, engine.module.attn.master_layout.tolist(), engine.module.qkv.weight.sum().item()


def test_sparse_model_trains_with_the_engine_on_two_ranks():
    (losses0, layout0, w0), (losses1, layout1, w1) = run_distributed(
        _train_sparse_model, world_size=2, args=(3,), timeout=240)
    assert layout0 == layout1, "the random layout is synchronised from rank 0"
    assert w0 == pytest.approx(w1, rel=1e-6), "replicas stay identical after reduced steps"
    assert losses0[-1] < losses0[0] and losses1[-1] < losses1[0]
