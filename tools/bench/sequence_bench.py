"""Longest sequence that fits a per-rank memory budget, for four long-context setups of a tiny
HF Llama trained by a ZeRO-3 engine on 2 gloo CPU ranks:

  (a) plain ZeRO-3 (data parallel: each rank runs the whole sequence)
  (b) + Ulysses sequence parallelism, sp=2
  (c) + ALST tiling (TiledMLP, tiled logits loss)
  (d) + FPDT chunked attention with chunk offload, activation checkpointing (cpu_checkpointing)
      and hidden-state offload

Memory is measured, not estimated: ``deepspeed.sequence.memory.TrackedTensorMemory`` counts the
live bytes of every tensor storage allocated during one training step (forward, backward,
optimizer step), split into device bytes and host-pool bytes (the offloaded copies; on a GPU
they would be in host RAM, on this CPU-only machine they are filed separately). The budget
applies to device bytes. Lengths double from --start until a setup no longer fits.

    python tools/bench/sequence_bench.py --budget-mib 64
"""
import argparse
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE)]

SP = 2
SETUPS = {"a": "plain ZeRO-3", "b": "+ Ulysses sp=2", "c": "+ ALST tiling",
          "d": "+ FPDT offload + ckpt offload"}


def _model(cfg):
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(**cfg, attn_implementation="sdpa")).float()


def _step(setup, cfg, seq, chunk, loss_shards):
    """One training step of ``setup`` at ``seq`` tokens; (peak device, peak host, loss, s)."""
    import deepspeed
    from deepspeed import comm as dist
    from deepspeed.sequence import parallel_state
    from deepspeed.sequence.alst import register_fpdt_attention, tile_mlps, tiled_causal_lm_loss
    from deepspeed.sequence.memory import measure
    from deepspeed.sequence.offload import get_checkpoint_hidden_states_offloading_ctx_manager
    from deepspeed.runtime.sequence_parallel.ulysses_sp import UlyssesSPAttentionHF
    import torch.distributed.nn.functional as dnn

    model = _model(cfg)
    config = {"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 3},
              "optimizer": {"type": "Adam", "params": {"lr": 1e-3}}}
    mpu = None
    if setup != "a":
        core = register_fpdt_attention(chunk, offload=True) if setup == "d" else "sdpa"
        mpu = UlyssesSPAttentionHF.register_with_transformers(
            model, core_attn_implementation=core, sequence_parallel_size=SP, micro_batch_size=1)
        config["sequence_parallel_size"] = SP
    if setup in "cd":
        tile_mlps(model)
    if setup == "d":
        model._set_gradient_checkpointing(
            True, gradient_checkpointing_func=deepspeed.checkpointing.checkpoint)
        config["activation_checkpointing"] = {"cpu_checkpointing": True}
    try:
        engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                          config=config, mpu=mpu)
        engine.train()
        ids = torch.randint(0, cfg["vocab_size"], (1, seq),
                            generator=torch.Generator().manual_seed(1))
        labels = torch.cat([ids[:, 1:], torch.full_like(ids[:, :1], -100)], dim=1)
        positions = torch.arange(seq)[None]
        if setup != "a":
            rank = mpu.get_sequence_parallel_rank()
            part = slice(rank * seq // SP, (rank + 1) * seq // SP)
            ids, labels, positions = ids[:, part], labels[:, part], positions[:, part]

        def sp_mean(loss):
            if setup == "a":
                return loss
            group = mpu.get_sequence_parallel_group()
            good = (labels != -100).sum()
            losses, counts = dnn.all_gather(loss, group=group), dnn.all_gather(good, group=group)
            return sum(l * c for l, c in zip(losses, counts)) / sum(counts)

        def one_step():
            offload = get_checkpoint_hidden_states_offloading_ctx_manager(model=model) \
                if setup == "d" else torch.autograd.graph.saved_tensors_hooks(lambda t: t,
                                                                              lambda t: t)
            with offload:
                if setup in "cd":
                    hidden = engine.module.model(input_ids=ids, position_ids=positions,
                                                 use_cache=False).last_hidden_state
                    loss, _ = tiled_causal_lm_loss(engine.module.lm_head, hidden, labels,
                                                   loss_shards)
                else:
                    logits = engine(input_ids=ids, position_ids=positions, use_cache=False).logits
                    loss = F.cross_entropy(logits.float().view(-1, logits.shape[-1]),
                                           labels.reshape(-1), ignore_index=-100)
                loss = sp_mean(loss)
            engine.backward(loss)
            engine.step()
            return loss.item()

        start = time.perf_counter()
        loss, tracker = measure(one_step)
        took = time.perf_counter() - start
        engine.destroy()
        return tracker.peak_device, tracker.peak_host, loss, took
    finally:
        if mpu is not None:
            parallel_state.destroy_sequence_parallel()
        dist.barrier()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--budget-mib", type=float, default=64.0)
    parser.add_argument("--start", type=int, default=1024)
    parser.add_argument("--max-seq", type=int, default=131072)
    parser.add_argument("--chunk", type=int, default=4096, help="FPDT chunk (global tokens)")
    parser.add_argument("--loss-shards", type=int, default=64)
    parser.add_argument("--setups", default="abcd")
    args = parser.parse_args()
    from deepspeed.testing.distributed import run_distributed
    import sequence_bench  # ranks find the worker by module name, not __main__

    budget = args.budget_mib * 2**20
    cfg = dict(vocab_size=2048, hidden_size=32, intermediate_size=128, num_hidden_layers=1,
               num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=args.max_seq)
    print(f"# tiny Llama {cfg}, 2 gloo CPU ranks, ZeRO-3, one step per length; budget "
          f"{args.budget_mib:.0f} MiB tracked device tensor bytes per rank; FPDT chunk "
          f"{args.chunk}, loss shards {args.loss_shards}; torch threads {torch.get_num_threads()}")
    print(f"{'setup':<34} {'seq':>7} {'device MiB':>11} {'host MiB':>9} {'loss':>7} {'s':>6}")
    longest = {}
    for setup in args.setups:
        seq, longest[setup] = args.start, 0
        while seq <= args.max_seq:
            out = run_distributed(sequence_bench._step, world_size=SP, timeout=3000,
                                  args=(setup, cfg, seq, min(args.chunk, seq), args.loss_shards))
            device = max(r[0] for r in out)
            host = max(r[1] for r in out)
            took = max(r[3] for r in out)
            fits = device <= budget
            print(f"({setup}) {SETUPS[setup]:<30} {seq:>7} {device / 2**20:>11.1f} "
                  f"{host / 2**20:>9.1f} {out[0][2]:>7.3f} {took:>6.1f} "
                  f"{'fits' if fits else 'over'}", flush=True)
            if not fits:
                break
            longest[setup], seq = seq, seq * 2
    print("\nlongest sequence within the budget (powers of two from --start):")
    base = longest.get("a") or None
    for setup, seq in longest.items():
        ratio = f"{seq / base:.0f}x (a)" if base else ""
        print(f"({setup}) {SETUPS[setup]:<30} {seq:>7}  {ratio}")


if __name__ == "__main__":
    main()
