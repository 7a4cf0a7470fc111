"""The Ulysses-Offload / ALST long-context stack on a tiny Llama, on CPU or GPU:

    deepspeed --num_gpus 2 examples/sequence/long_context_llama.py [--seq 16384] [--chunk 4096]

Ulysses sequence parallelism (sp=2) with FPDT chunked attention (chunks offloaded to the host
pool), TiledMLP, a tiled logits loss, activation checkpointing with cpu_checkpointing and
hidden-state offload, under ZeRO-3. Each step prints the loss and the peak tensor memory this
rank allocated during the step (measured by deepspeed.sequence.memory.TrackedTensorMemory).
"""
import argparse
import os
import sys

import torch
import torch.distributed.nn.functional as dnn

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from common import require  # noqa: E402

require("transformers")
from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402

import deepspeed  # noqa: E402
from deepspeed.runtime.sequence_parallel.ulysses_sp import (  # noqa: E402
    UlyssesSPAttentionHF, get_checkpoint_hidden_states_offloading_ctx_manager)
from deepspeed.sequence.alst import register_fpdt_attention, tile_mlps, tiled_causal_lm_loss  # noqa: E402
from deepspeed.sequence.memory import measure  # noqa: E402

parser = argparse.ArgumentParser()
parser.add_argument("--seq", type=int, default=16384)
parser.add_argument("--chunk", type=int, default=4096)
parser.add_argument("--steps", type=int, default=3)
parser.add_argument("--local_rank", type=int, default=0)
args = parser.parse_args()

deepspeed.init_distributed()
torch.manual_seed(0)
model = LlamaForCausalLM(LlamaConfig(
    vocab_size=2048, hidden_size=64, intermediate_size=256, num_hidden_layers=2,
    num_attention_heads=4, num_key_value_heads=1, max_position_embeddings=args.seq,
    attn_implementation="sdpa"))
mpu = UlyssesSPAttentionHF.register_with_transformers(
    model, core_attn_implementation=register_fpdt_attention(args.chunk, offload=True),
    sequence_parallel_size=2, micro_batch_size=1)
tile_mlps(model)
model._set_gradient_checkpointing(True, gradient_checkpointing_func=deepspeed.checkpointing.checkpoint)
engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), mpu=mpu, config={
    "train_micro_batch_size_per_gpu": 1, "sequence_parallel_size": 2,
    "zero_optimization": {"stage": 3}, "activation_checkpointing": {"cpu_checkpointing": True},
    "optimizer": {"type": "Adam", "params": {"lr": 1e-3}}})

group, rank = mpu.get_sequence_parallel_group(), mpu.get_sequence_parallel_rank()
part = slice(rank * args.seq // 2, (rank + 1) * args.seq // 2)
sample = torch.randint(0, 2048, (1, args.seq), generator=torch.Generator().manual_seed(0))
labels = torch.cat([sample[:, 1:], torch.full_like(sample[:, :1], -100)], dim=1)[:, part]
ids, positions = sample[:, part], torch.arange(args.seq)[None, part]
ids, labels, positions = (t.to(engine.device) for t in (ids, labels, positions))


def step():
    with get_checkpoint_hidden_states_offloading_ctx_manager(model=model):
        hidden = engine.module.model(input_ids=ids, position_ids=positions,
                                     use_cache=False).last_hidden_state
        loss, tokens = tiled_causal_lm_loss(engine.module.lm_head, hidden, labels, 64)
        losses, counts = dnn.all_gather(loss, group=group), dnn.all_gather(tokens, group=group)
        loss = sum(l * c for l, c in zip(losses, counts)) / sum(counts)
    engine.backward(loss)
    engine.step()
    return loss.item()


for n in range(args.steps):
    loss, mem = measure(step)
    print(f"rank {rank} step {n}: loss {loss:.4f}, peak device tensors "
          f"{mem.peak_device / 2**20:.1f} MiB, host pool {mem.peak_host / 2**20:.1f} MiB "
          f"(sequence {args.seq}, {args.seq // 2} tokens per rank)", flush=True)
