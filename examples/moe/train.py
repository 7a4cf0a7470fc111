"""The Mixture-of-Experts tutorial as a runnable example: a small GPT whose MLPs, in every other
transformer block, are replaced by a ``deepspeed.moe.layer.MoE`` layer with the block's MLP as
the expert, trained with expert parallelism through ``deepspeed.initialize``.

    deepspeed --num_gpus 2 examples/moe/train.py [--ep-world-size 2] [--num-experts 4]
              [--top-k 1] [--mlp-type standard|residual] [--steps 300]
              [--deepspeed_config examples/moe/ds_config.json]

What the tutorial asks of a model, and where it is here:

- the MoE layer takes the place of a dense MLP: ``MoE(hidden_size=n_embd, expert=block.mlp,
  num_experts=..., ep_size=..., k=...)``; its input and output width are both ``hidden_size``;
- ``forward`` returns ``(output, l_aux, exp_counts)``: the load-balancing losses of all MoE
  layers are summed and added to the LM loss scaled by ``--moe-loss-coeff`` (0.01, as the NLG
  tutorial recommends);
- the optimizer gets the expert parameters in param groups of their own:
  ``model_parameters=split_params_into_different_moe_groups_for_optimizer(...)``
  (``create_moe_param_groups`` below, as in the tutorial).

With 2 processes (gloo on this CPU machine) and ``--ep-world-size 2 --num-experts 4`` each rank
holds 2 of each MoE layer's 4 experts; each rank gates its own tokens and an all-to-all sends
every token to the rank owning its expert and brings the result back. Dense weights (attention,
embeddings, gates) are averaged over all ranks, an expert's gradients over the ranks holding the
same expert only. ``--num-experts 2 4`` gives each MoE layer its own count (the pyramid of
PR-MoE) and ``--mlp-type residual`` adds the dense residual MLP (Residual-MoE): both make PR-MoE.

The data are the README demo's synthetic Markov-chain tokens (``examples/gpt.py``), so the loss
falls from ln(32) = 3.47 towards the chain's entropy within a couple of hundred steps. The script
exits non-zero unless the LM loss fell.

The default config (``ds_config.json``) is ZeRO stage 0 without gradient clipping, and the
script saves no checkpoint: when this example was written the ``moe`` plugin refused ZeRO
stages >= 1, clipping and checkpoints with expert parallelism (``ep_size > 1``). Another
config can be given with ``--deepspeed_config``.
"""
import argparse
import math
import os
import sys
import time

import torch
from torch import nn
from torch.nn import functional as F

import deepspeed
from deepspeed import comm as dist
from deepspeed.moe.layer import MoE
from deepspeed.moe.utils import is_moe_param, split_params_into_different_moe_groups_for_optimizer

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
from common import global_mean, positive_int, replicas_identical  # noqa: E402
from gpt import GPT, GPTConfig, MarkovTokens  # noqa: E402  (the README demo's model and data)


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--local_rank", type=int, default=-1)
    parser.add_argument("--steps", type=positive_int, default=300,
                        help="optimizer steps (default 300)")
    parser.add_argument("--print_every", type=positive_int, default=25)
    parser.add_argument("--n-layer", type=positive_int, default=4,
                        help="transformer blocks; every --expert-interval-th is MoE (default 4)")
    parser.add_argument("--n-embd", type=positive_int, default=64)
    parser.add_argument("--expert-interval", type=positive_int, default=2,
                        help="every N-th block gets an MoE layer, the last of each N (default 2)")
    # the MoE tutorials' arguments
    parser.add_argument("--ep-world-size", type=positive_int, default=None,
                        help="expert-parallel size: ranks sharing one MoE layer's experts "
                             "(default: the world size); must divide the world size and "
                             "every --num-experts")
    parser.add_argument("--num-experts", type=positive_int, nargs="+", default=[4],
                        help="experts per MoE layer: one count for all, or one per MoE layer "
                             "(a pyramid, e.g. 2 4) (default 4)")
    parser.add_argument("--mlp-type", choices=("standard", "residual"), default="standard",
                        help="residual: Residual-MoE, a dense MLP mixed in by a learned "
                             "coefficient (with a pyramid of --num-experts: PR-MoE)")
    parser.add_argument("--top-k", type=int, choices=(1, 2), default=1)
    parser.add_argument("--capacity-factor", type=float, default=1.0,
                        help="training capacity factor (default 1.0)")
    parser.add_argument("--eval-capacity-factor", type=float, default=1.0)
    parser.add_argument("--min-capacity", type=positive_int, default=4)
    parser.add_argument("--noisy-gate-policy", choices=("None", "Jitter", "RSample"),
                        default=None)
    parser.add_argument("--disable-moe-token-dropping", action="store_true",
                        help="no capacity limit: every token reaches its expert")
    parser.add_argument("--moe-loss-coeff", type=float, default=0.01,
                        help="scale of the load-balancing loss added to the LM loss (0.01)")
    deepspeed.add_config_arguments(parser)
    return parser.parse_args()


class MoEBlock(nn.Module):
    """A ``gpt.Block`` whose MLP is replaced by an MoE layer with that MLP as the expert (the
    layer deep-copies it once per local expert). ``forward`` returns ``(x, l_aux)``."""

    def __init__(self, block, moe):
        super().__init__()
        self.ln_1, self.attn, self.ln_2 = block.ln_1, block.attn, block.ln_2
        self.moe = moe

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        out, l_aux, _ = self.moe(self.ln_2(x))
        return x + out, l_aux


class MoEGPT(GPT):
    """The demo's GPT with MoE layers in place of the MLPs of blocks ``interval-1``,
    ``2*interval-1``, ... ``model(idx, targets)`` returns ``(lm_loss, l_aux)``, the second the
    sum of the MoE layers' load-balancing losses."""

    def __init__(self, cfg, args, ep_size):
        super().__init__(cfg)
        moe_blocks = list(range(args.expert_interval - 1, cfg.n_layer, args.expert_interval))
        counts = args.num_experts
        if len(counts) == 1:
            counts = counts * len(moe_blocks)
        if len(counts) != len(moe_blocks):
            raise SystemExit(f"--num-experts has {len(counts)} entries but the model has "
                             f"{len(moe_blocks)} MoE layers (blocks {moe_blocks})")
        for index, num_experts in zip(moe_blocks, counts):
            block = self.blocks[index]
            moe = MoE(hidden_size=cfg.n_embd, expert=block.mlp, num_experts=num_experts,
                      ep_size=ep_size, k=args.top_k, use_residual=args.mlp_type == "residual",
                      capacity_factor=args.capacity_factor,
                      eval_capacity_factor=args.eval_capacity_factor,
                      min_capacity=args.min_capacity, noisy_gate_policy=args.noisy_gate_policy,
                      drop_tokens=not args.disable_moe_token_dropping)
            self.blocks[index] = MoEBlock(block, moe)
        self.moe_blocks = moe_blocks
        self.expert_counts = counts

    def forward(self, idx, targets):
        pos = torch.arange(idx.size(1), device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        l_aux = x.new_zeros(())
        for block in self.blocks:
            if isinstance(block, MoEBlock):
                x, aux = block(x)
                l_aux = l_aux + aux
            else:
                x = block(x)
        logits = self.lm_head(self.ln_f(x))
        lm_loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1))
        return lm_loss, l_aux


def create_moe_param_groups(model):
    """The tutorial's helper: one group of all parameters, split so that each expert group
    (``ep_size_N``) gets param groups of its own (marked ``'moe': True``)."""
    parameters = {"params": [p for p in model.parameters()], "name": "parameters"}
    return split_params_into_different_moe_groups_for_optimizer(parameters)


def main():
    args = parse_args()
    deepspeed.init_distributed()  # the MoE layers build their expert groups when constructed
    rank, world = dist.get_rank(), dist.get_world_size()
    ep_size = args.ep_world_size or world
    if world % ep_size:
        raise SystemExit(f"--ep-world-size {ep_size} must divide the world size {world}")
    torch.manual_seed(0)  # the same initial weights on every rank (experts: a copy each)
    cfg = GPTConfig(vocab_size=32, block_size=32, n_layer=args.n_layer, n_head=4,
                    n_embd=args.n_embd)
    model = MoEGPT(cfg, args, ep_size)
    data = MarkovTokens(samples=8192, seq_len=cfg.block_size, vocab_size=cfg.vocab_size,
                        seed=1234)
    held_out = MarkovTokens(samples=64, seq_len=cfg.block_size, vocab_size=cfg.vocab_size,
                            seed=1234)  # the first rows of the same stream: a sanity check
    config = args.deepspeed_config or os.path.join(HERE, "ds_config.json")
    param_groups = create_moe_param_groups(model)
    engine, _, loader, _ = deepspeed.initialize(model=model, model_parameters=param_groups,
                                                training_data=data, config=config)
    if rank == 0:
        groups = [(g.get("name"), len(g["params"]), bool(g.get("moe")))
                  for g in engine.basic_optimizer.param_groups]
        experts = sum(p.numel() for p in model.parameters() if hasattr(p, "allreduce"))
        print(f"MoE GPT: {cfg.n_layer} blocks, MoE in blocks {model.moe_blocks} with "
              f"{model.expert_counts} experts ({args.mlp_type}, top-{args.top_k}), "
              f"ep_size {ep_size} on {world} ranks: {num_local(model)} local experts per "
              f"layer on this rank", flush=True)
        print(f"parameters on rank 0: {sum(p.numel() for p in model.parameters()):,} "
              f"({experts:,} in experts); optimizer param groups (name, params, moe): "
              f"{groups}", flush=True)
        print(f"LM loss starts near ln({cfg.vocab_size}) = {math.log(cfg.vocab_size):.2f}, "
              f"the data's floor is about {data.entropy:.2f}", flush=True)

    first = last = None
    window = [0.0, 0.0, 0]
    start = time.perf_counter()
    done = False
    while not done:
        for x, y in loader:
            lm_loss, l_aux = engine(x.to(engine.device), y.to(engine.device))
            loss = lm_loss + args.moe_loss_coeff * l_aux
            engine.backward(loss)
            engine.step()
            window[0] += lm_loss.item()
            window[1] += l_aux.item()
            window[2] += 1
            step = engine.global_steps
            done = step >= args.steps
            if step == 1 or step % args.print_every == 0 or done:
                lm = global_mean(window[0] / window[2], world)
                aux = global_mean(window[1] / window[2], world)
                first = lm if first is None else first
                last = lm
                window = [0.0, 0.0, 0]
                if rank == 0:
                    print(f"step {step:4d}: lm loss {lm:.4f}  l_aux {aux:.3f}  "
                          f"({time.perf_counter() - start:5.1f} s)", flush=True)
            if done:
                break

    # evaluation: eval_capacity_factor applies; the forward still exchanges tokens
    engine.eval()
    with torch.no_grad():
        rows = held_out.tokens[rank * 64 // world:(rank + 1) * 64 // world]
        eval_lm, _ = engine(rows[:, :-1].to(engine.device), rows[:, 1:].to(engine.device))
    eval_lm = global_mean(eval_lm.item(), world)
    counts = expert_load(model, engine.device)
    # dense weights must be the same on every rank (experts differ by design)
    identical = replicas_identical(p for p in engine.module.parameters() if not is_moe_param(p))
    if rank == 0:
        print("=" * 60)
        print(f"MoE example summary ({world} ranks, ep_size {ep_size}, backend "
              f"{dist.get_backend()})")
        print(f"  optimizer steps      : {engine.global_steps} x {engine.train_batch_size()} "
              f"sequences")
        print(f"  train lm loss        : {first:.4f} -> {last:.4f}")
        print(f"  eval lm loss         : {eval_lm:.4f}")
        for index, c in zip(model.moe_blocks, counts):
            print(f"  block {index} tokens/expert: {c} (last eval batch, all ranks)")
        print(f"  dense replicas identical: {identical}")
        print(f"  wall time            : {time.perf_counter() - start:.1f} s")
        print("=" * 60, flush=True)
    engine.destroy()
    if last >= first:
        raise SystemExit(f"loss did not fall: {first:.4f} -> {last:.4f}")
    if not identical:
        raise SystemExit("dense weights differ between ranks")


def num_local(model):
    return [b.moe.num_local_experts for b in model.blocks if isinstance(b, MoEBlock)]


def expert_load(model, device):
    """Each MoE layer's ``exp_counts`` of the last forward, summed over the ranks."""
    out = []
    for block in model.blocks:
        if isinstance(block, MoEBlock):
            counts = block.moe.deepspeed_moe.exp_counts.to(device=device, dtype=torch.int64)
            dist.all_reduce(counts)
            out.append(counts.tolist())
    return out


if __name__ == "__main__":
    main()
