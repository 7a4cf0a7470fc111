"""MiCS against ZeRO-3 on 4 gloo CPU ranks seen as 2 "nodes" x 2: bytes per step that cross a
node boundary and that stay inside a node, by collective, and the step time.

    python tools/bench/mics_bench.py [--n_layer 4 --n_embd 256 --steps 6]

Contestants: ZeRO-3; MiCS with shard groups of 2 (one per node); MiCS with one shard group of 4
gathering in two hops (``mics_hierarchical_params_gather``, ``LOCAL_WORLD_SIZE=2``); MiCS with
shard size 1 (data parallelism). Bytes are what ``deepspeed.comm`` handed to the backend per
rank (the comm records' per-rank message size times the group size minus one for gathers and
reduce-scatters, times 2(n-1)/n for all-reduces: the ring's traffic), averaged over the measured
steps and split by whether the op's group (recorded per collective) spans both nodes. The
model is the demo GPT (``examples/gpt.py``). Step time is the slowest rank's median. The final
losses of every contestant are printed next to ZeRO-3's. A tool, never a test.
"""
import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parents[1] / "examples"), str(HERE)]

NODE = 2  # ranks per simulated node
CONTESTANTS = {
    "ZeRO-3": {},
    "MiCS shard 2": {"mics_shard_size": 2},
    "MiCS shard 4 two-hop": {"mics_shard_size": 4, "mics_hierarchical_params_gather": True},
    "MiCS shard 1 (DP)": {"mics_shard_size": 1},
}


def _traffic(op, size, group):
    """Bytes one rank moves for one op in a ring over ``group``."""
    n = len(group)
    if n <= 1:
        return 0
    if op in ("all_reduce",):
        return size * 2 * (n - 1) / n
    return size * (n - 1)  # all-gather / reduce-scatter: per-rank piece times (n - 1)


def _run(name, zero, n_layer, n_embd, steps):
    import deepspeed
    from deepspeed import comm as dist
    from gpt import GPT, GPTConfig, MarkovTokens

    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=64, block_size=64, n_layer=n_layer, n_head=4,
                          n_embd=n_embd))
    config = {"train_micro_batch_size_per_gpu": 2, "gradient_clipping": 1.0,
              "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
              "zero_optimization": dict({"stage": 3}, **zero)}
    engine, *_ = deepspeed.initialize(model=model, config=config)
    rank, world = dist.get_rank(), dist.get_world_size()
    data = MarkovTokens(samples=(steps + 1) * 2 * world, seq_len=64, vocab_size=64)
    records = []

    def observe(r):
        records.append((r.op, tuple(r.group_ranks or ()), r.size_bytes))

    times, loss = [], None
    for step in range(steps + 1):  # step 0 warms up (traces the model) and is not measured
        if step == 1:
            dist.add_comm_observer(observe)
        index = step * 2 * world + rank * 2
        x, y = zip(*(data[index + i] for i in range(2)))
        start = time.perf_counter()
        loss = engine(torch.stack(x), torch.stack(y))
        engine.backward(loss)
        engine.step()
        if step:
            times.append(time.perf_counter() - start)
    dist.remove_comm_observer(observe)
    engine.destroy()
    cross, local = {}, {}
    for op, group, size in records:
        spans = len({r // NODE for r in group}) > 1
        bucket = cross if spans else local
        bucket[op] = bucket.get(op, 0) + _traffic(op, size, group) / steps
    median = torch.tensor([statistics.median(times)])
    dist.all_reduce(median, op=dist.ReduceOp.MAX)
    mean_loss = loss.detach().clone()
    dist.all_reduce(mean_loss)
    return name, cross, local, float(median), float(mean_loss) / world


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n_layer", type=int, default=4)
    parser.add_argument("--n_embd", type=int, default=256)
    parser.add_argument("--steps", type=int, default=6)
    args = parser.parse_args(argv)
    from deepspeed.testing.distributed import run_distributed

    print(f"demo GPT n_layer={args.n_layer} n_embd={args.n_embd}, 4 gloo CPU ranks as 2 nodes "
          f"x 2, torch {torch.__version__}, load average {os.getloadavg()[0]:.2f} "
          f"(shared machine); bytes per rank per step")
    rows = []
    for name, zero in CONTESTANTS.items():
        rows.append(run_distributed(_run, world_size=4, timeout=600,
                                    env={"LOCAL_WORLD_SIZE": str(NODE)},
                                    args=(name, zero, args.n_layer, args.n_embd,
                                          args.steps))[0])
    base = rows[0]
    base_cross = sum(base[1].values())
    print(f"  {'contestant':22s} {'cross-node MiB':>14s} {'vs ZeRO-3':>9s} {'in-node MiB':>11s} "
          f"{'step ms':>8s} {'vs ZeRO-3':>9s} {'loss':>8s}  cross-node by op (MiB)")
    for name, cross, local, seconds, loss in rows:
        total = sum(cross.values())
        ops = ", ".join(f"{op} {v / 2**20:.2f}" for op, v in sorted(cross.items()))
        print(f"  {name:22s} {total / 2**20:14.2f} {total / base_cross:9.3f} "
              f"{sum(local.values()) / 2**20:11.2f} {seconds * 1e3:8.1f} "
              f"{seconds / base[3]:9.3f} {loss:8.4f}  {ops or '-'}")


if __name__ == "__main__":
    main()
