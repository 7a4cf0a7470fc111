"""AutoTP training on 2 CPU ranks: per-rank parameter memory and step time, TP 1 (pure data
parallel, 2 replicas) against TP 2 (``deepspeed.tp_model_init(tp_size=2)``, one model split
over both ranks), for the same global batch and the same tiny Llama built from a config.

    python tools/bench/tensor_parallel_bench.py [--hidden 512] [--layers 4] [--vocab 2048]
                                                [--seq 128] [--batch 4] [--steps 10]

Both runs train with AdamW through ``deepspeed.initialize`` (fp32, no ZeRO); TP 1 gives each
rank ``batch / 2`` sequences, TP 2 gives both ranks the whole ``batch``. Printed per rank: the
bytes of the parameters the engine holds (and of the transformer blocks alone: embeddings,
final norm and LM head stay replicated under AutoTP), and the median step time over
``--steps`` after 2 warm-up steps; then the TP 2 / TP 1 ratios. A tool, not a test.
"""
import argparse
import statistics
import time

import torch


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--vocab", type=int, default=2048)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--batch", type=int, default=4, help="global batch (sequences per step)")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads per rank")
    return p.parse_args(argv)


def _model(args):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=args.vocab, hidden_size=args.hidden,
                         intermediate_size=int(args.hidden * 8 / 3) // 64 * 64,
                         num_hidden_layers=args.layers, num_attention_heads=args.heads,
                         num_key_value_heads=args.heads, max_position_embeddings=args.seq)
    torch.manual_seed(0)
    return LlamaForCausalLM(config).float()


def _bytes(params):
    return sum(p.numel() * p.element_size() for p in params)


def _run(args, tp):
    import deepspeed
    import deepspeed.comm as dist

    model = _model(args)
    if tp > 1:
        model = deepspeed.tp_model_init(model, tp_size=tp, dtype=torch.float32)
    dp = dist.get_world_size() // tp
    micro = args.batch // dp
    config = {"train_micro_batch_size_per_gpu": micro, "gradient_accumulation_steps": 1,
              "steps_per_print": 10 ** 9, "gradient_clipping": 1.0,
              "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}}}
    engine = deepspeed.initialize(model=model, config=config,
                                  model_parameters=model.parameters())[0]
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, args.vocab, (args.batch, args.seq), generator=gen)
    rank = engine.mpu.get_data_parallel_rank() if engine.mpu is not None else dist.get_rank()
    mine = ids[rank * micro:(rank + 1) * micro]
    times = []
    for step in range(args.steps + 2):
        dist.barrier()
        start = time.perf_counter()
        loss = engine(input_ids=mine, labels=mine).loss
        engine.backward(loss)
        engine.step()
        if step >= 2:
            times.append(time.perf_counter() - start)
    blocks = _bytes(engine.module.model.layers.parameters())
    total = _bytes(engine.module.parameters())
    engine.destroy()
    return {"params": total, "blocks": blocks, "step_s": statistics.median(times)}


def _rank_main(args):
    import deepspeed.comm as dist
    from deepspeed.utils import groups

    torch.set_num_threads(args.threads)
    one = _run(args, 1)
    two = _run(args, 2)
    groups.set_mpu(None)
    rows = [None] * dist.get_world_size()
    dist.all_gather_object(rows, (one, two))
    return rows


def main(argv=None):
    args = parse_args(argv)
    from deepspeed.testing import run_distributed

    rows = run_distributed(_rank_main, world_size=2, args=(args,), timeout=1800, fresh=True)[0]
    mib = 2 ** 20
    print(f"tiny Llama hidden={args.hidden} layers={args.layers} heads={args.heads} "
          f"vocab={args.vocab} seq={args.seq}, global batch {args.batch}, 2 gloo CPU ranks, "
          f"{args.threads} thread(s) each")
    print(f"{'':8}{'rank':>5}{'params MiB':>12}{'blocks MiB':>12}{'step ms':>10}")
    for rank, (one, two) in enumerate(rows):
        for name, r in (("TP 1", one), ("TP 2", two)):
            print(f"{name:8}{rank:>5}{r['params'] / mib:>12.2f}{r['blocks'] / mib:>12.2f}"
                  f"{r['step_s'] * 1e3:>10.1f}")
    one, two = rows[0]
    print(f"TP 2 / TP 1 per-rank parameter memory: {two['params'] / one['params']:.3f} "
          f"(transformer blocks alone: {two['blocks'] / one['blocks']:.3f})")
    slow1 = max(r[0]["step_s"] for r in rows)
    slow2 = max(r[1]["step_s"] for r in rows)
    print(f"TP 2 / TP 1 step time (slowest rank): {slow2 / slow1:.3f}")


if __name__ == "__main__":
    main()
