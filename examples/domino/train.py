"""Domino: a tiny GPT whose transformer is split over 2 tensor-parallel CPU ranks, with the
all-reduces hidden behind the other half of the batch.

    deepspeed --num_gpus 2 examples/domino/train.py --steps 20
    deepspeed --num_gpus 4 examples/domino/train.py --tp 2     # TP 2 x DP 2

``init_tensor_parallel_groups`` builds the tensor x data parallel groups; the
``DominoTransformer`` layers split their heads and MLP columns over the tensor-parallel group
and cut each batch into 2 pieces; ``deepspeed.initialize`` (no ``mpu`` needed: the domino
plugin hands the engine the layers' groups) trains it. The last step is traced with
``record_overlap`` to count the all-reduces that were in flight while the other piece computed.
"""
import argparse

import torch
import torch.nn.functional as F
from torch import nn

import deepspeed
from deepspeed.domino import DominoTransformer, record_overlap
from deepspeed.utils import groups

VOCAB = 128


class GPT(nn.Module):
    def __init__(self, config, num_chunks):
        super().__init__()
        self.embedding = nn.Embedding(VOCAB, config["hidden_size"])
        self.transformer = DominoTransformer(config, num_chunks=num_chunks)
        self.head = nn.Linear(config["hidden_size"], VOCAB, bias=False)

    def forward(self, ids):
        logits = self.head(self.transformer(self.embedding(ids)))
        return F.cross_entropy(logits[:, :-1].flatten(0, 1), ids[:, 1:].flatten())


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--local_rank", type=int, default=-1)
    p.add_argument("--tp", type=int, default=2)
    p.add_argument("--chunks", type=int, default=2)
    p.add_argument("--steps", type=int, default=20)
    args = p.parse_args()

    deepspeed.init_distributed()
    unit = groups.init_tensor_parallel_groups(args.tp)
    config = dict(hidden_size=64, num_attention_heads=4, ffn_hidden_size=256, num_layers=2)
    torch.manual_seed(0)  # the same full weights on every rank, each keeping its slice
    model = GPT(config, args.chunks)
    ds_config = {"train_micro_batch_size_per_gpu": 4, "gradient_clipping": 1.0,
                 "optimizer": {"type": "AdamW", "params": {"lr": 3e-3}}, "steps_per_print": 10 ** 9}
    engine, *_ = deepspeed.initialize(model=model, config=ds_config,
                                      model_parameters=model.parameters())
    rank = torch.distributed.get_rank()
    if rank == 0:
        qkv = engine.module.transformer.layers[0].self_attention.query_key_value.weight
        print(f"Domino: tensor parallel {unit.tp_size} x data parallel {unit.dp_size}, "
              f"{args.chunks} pieces per batch; query_key_value on this rank: {tuple(qkv.shape)}")
    gen = torch.Generator().manual_seed(100 + unit.dp_rank)  # each replica its own batches
    batches = [torch.randint(0, VOCAB, (4, 32), generator=gen) for _ in range(4)]
    first = last = None
    for step in range(args.steps):
        with record_overlap() as trace:
            loss = engine(batches[step % len(batches)])
            engine.backward(loss)
        engine.step()
        first = loss.item() if first is None else first
        last = loss.item()
    if rank == 0:
        launches = sum(kind == "launch" for kind, _, _ in trace.events)
        print(f"steps: {args.steps} loss: {first:.3f} -> {last:.3f}")
        print(f"last step: {launches} all-reduces, {trace.overlapped()} of them in flight while "
              f"other compute ran; {trace.wait_seconds() * 1e3:.1f} ms blocked in waits")
    engine.destroy()
    if last >= first:
        raise SystemExit("the loss did not fall")


if __name__ == "__main__":
    main()
