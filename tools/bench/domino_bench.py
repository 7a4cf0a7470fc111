"""Domino on 2 CPU gloo ranks (TP 2): training step time of plain tensor parallelism (the whole
batch, blocking all-reduces), of Domino's schedule with blocking all-reduces, and of Domino
(the batch in ``--chunks`` pieces, asynchronous all-reduces overlapping the other piece), and
of Domino with the row-parallel outputs also cut in 2 hidden pieces, on the same weights and
batch; plus the time each rank spent blocked waiting for all-reduces.

    python tools/bench/domino_bench.py [--hidden 256] [--layers 2] [--heads 8] [--seq 128]
                                       [--batch 8] [--chunks 2] [--steps 10] [--threads 1]

The model is a GPT built from ``DominoTransformer`` (embedding and LM head replicated); a step
is forward, backward and AdamW. The variants run interleaved, step by step, so machine
load hits them alike; printed: median step times over ``--steps`` after 2 warm-up steps, the
ratios to plain TP, and the median blocked-in-wait time per step (from ``record_overlap``).
On gloo the all-reduce runs on CPU threads competing with the matmuls for the same cores, so
the gain measured here is a floor of what NCCL on GPUs (separate copy engines) would show.
A tool, not a test.
"""
import argparse
import statistics
import time

import torch
import torch.nn.functional as F
from torch import nn

VARIANTS = (("plain TP", 1, False, 1), ("Domino, blocking", None, False, 1),
            ("Domino", None, True, 1), ("Domino + hidden 2", None, True, 2))


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--vocab", type=int, default=1024)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--chunks", type=int, default=2)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads per rank")
    return p.parse_args(argv)


class _GPT(nn.Module):
    def __init__(self, args, num_chunks, overlap, hidden_chunks):
        super().__init__()
        from deepspeed.domino import DominoTransformer

        torch.manual_seed(0)
        self.embedding = nn.Embedding(args.vocab, args.hidden)
        self.transformer = DominoTransformer(
            dict(hidden_size=args.hidden, num_attention_heads=args.heads,
                 num_layers=args.layers), num_chunks=num_chunks, overlap=overlap,
            hidden_chunks=hidden_chunks)
        self.head = nn.Linear(args.hidden, args.vocab, bias=False)

    def forward(self, ids):
        logits = self.head(self.transformer(self.embedding(ids)))
        return F.cross_entropy(logits[:, :-1].flatten(0, 1), ids[:, 1:].flatten())


def _step(model, optimizer, ids):
    loss = model(ids)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    return loss.item()


def _rank_main(args):
    import deepspeed.comm as dist
    from deepspeed.domino import record_overlap
    from deepspeed.utils import groups

    torch.set_num_threads(args.threads)
    previous = groups.mpu
    groups.init_tensor_parallel_groups(2)
    try:
        models = [_GPT(args, chunks or args.chunks, overlap, hidden)
                  for _, chunks, overlap, hidden in VARIANTS]
        optimizers = [torch.optim.AdamW(m.parameters(), lr=1e-4) for m in models]
        ids = torch.randint(0, args.vocab, (args.batch, args.seq),
                            generator=torch.Generator().manual_seed(0))
        times = [[] for _ in VARIANTS]
        waits = [[] for _ in VARIANTS]
        losses = [[] for _ in VARIANTS]
        for step in range(args.steps + 2):
            for i, (model, optimizer) in enumerate(zip(models, optimizers)):
                dist.barrier()
                start = time.perf_counter()
                with record_overlap() as trace:
                    losses[i].append(_step(model, optimizer, ids))
                if step >= 2:
                    times[i].append(time.perf_counter() - start)
                    waits[i].append(trace.wait_seconds())
        rows = [(statistics.median(t), statistics.median(w)) for t, w in zip(times, waits)]
        drift = max(abs(a - b) for a, b in zip(losses[0], losses[2]))
    finally:
        groups.set_mpu(previous)
    gathered = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, (rows, drift))
    return gathered


def main(argv=None):
    args = parse_args(argv)
    from deepspeed.testing import run_distributed

    gathered = run_distributed(_rank_main, world_size=2, args=(args,), timeout=1800, fresh=True)[0]
    print(f"GPT hidden={args.hidden} layers={args.layers} heads={args.heads} vocab={args.vocab} "
          f"seq={args.seq} batch={args.batch}, TP 2 on 2 gloo CPU ranks, {args.threads} "
          f"thread(s) each, Domino chunks={args.chunks}")
    print(f"{'variant':20}{'rank':>5}{'step ms':>10}{'blocked in waits ms':>22}")
    for rank, (rows, _) in enumerate(gathered):
        for (name, *_), (step, wait) in zip(VARIANTS, rows):
            print(f"{name:20}{rank:>5}{step * 1e3:>10.1f}{wait * 1e3:>22.1f}")
    slowest = [max(rows[i][0] for rows, _ in gathered) for i in range(len(VARIANTS))]
    for (name, *_), value in zip(VARIANTS[1:], slowest[1:]):
        print(f"{name} / plain TP step time (slowest rank): {value / slowest[0]:.3f}")
    print(f"largest |loss(Domino) - loss(plain TP)| over the steps: "
          f"{max(d for _, d in gathered):.2e}")


if __name__ == "__main__":
    main()
