"""The transformer-kernel tutorial as a runnable example: a small BERT encoder whose layers are
``DeepSpeedTransformerLayer``s, built exactly as the tutorial does (a ``DeepSpeedTransformerConfig``
with ``max_seq_length``, then a ``ModuleList`` of deep-copied layers), trained with
``deepspeed.initialize`` on a synthetic task (predict each token's left neighbour).

    deepspeed --num_gpus 2 examples/transformer_kernel/train.py [--deepspeed_transformer_kernel]
        [--attention_dropout_checkpoint] [--normalize_invertible] [--gelu_checkpoint]
        [--pre_layer_norm] [--steps 80]

Without ``--deepspeed_transformer_kernel`` the encoder is HF ``BertLayer``s (the tutorial's
baseline); the loss must fall either way, and the script exits non-zero if it does not. Runs on
CPU (torch path) or GPU (Triton kernels).
"""
import argparse
import copy
import os
import sys

import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from common import global_mean, positive_int, require  # noqa: E402

import deepspeed  # noqa: E402
from deepspeed.ops.transformer import DeepSpeedTransformerConfig, DeepSpeedTransformerLayer  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
VOCAB, SEQ, HIDDEN, HEADS, LAYERS = 16, 16, 64, 4, 2


class Encoder(nn.Module):
    def __init__(self, args):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, HIDDEN)
        self.pos = nn.Parameter(torch.randn(SEQ, HIDDEN))
        if args.deepspeed_transformer_kernel:
            config = DeepSpeedTransformerConfig(batch_size=8, max_seq_length=SEQ, hidden_size=HIDDEN,
                                                heads=HEADS, attn_dropout_ratio=0.1,
                                                hidden_dropout_ratio=0.1, num_hidden_layers=LAYERS,
                                                initializer_range=0.02, local_rank=args.local_rank,
                                                seed=1234, fp16=False,
                                                pre_layer_norm=args.pre_layer_norm,
                                                attn_dropout_checkpoint=args.attention_dropout_checkpoint,
                                                normalize_invertible=args.normalize_invertible,
                                                gelu_checkpoint=args.gelu_checkpoint)
            self.layer = nn.ModuleList([copy.deepcopy(DeepSpeedTransformerLayer(config))
                                        for _ in range(config.num_hidden_layers)])
        else:
            require("transformers")
            from transformers import BertConfig
            from transformers.models.bert.modeling_bert import BertLayer

            cfg = BertConfig(hidden_size=HIDDEN, num_attention_heads=HEADS, intermediate_size=4 * HIDDEN)
            self.layer = nn.ModuleList([BertLayer(cfg) for _ in range(LAYERS)])
        self.final_norm = nn.LayerNorm(HIDDEN) if args.pre_layer_norm else nn.Identity()
        self.head = nn.Linear(HIDDEN, VOCAB)

    def forward(self, ids):
        x = self.embed(ids) + self.pos[:ids.shape[1]]
        mask = torch.zeros(ids.shape[0], 1, 1, ids.shape[1], dtype=x.dtype, device=x.device)
        for layer in self.layer:
            x = layer(x, mask)
            x = x[0] if isinstance(x, tuple) else x
        return self.head(self.final_norm(x))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=positive_int, default=80)
    parser.add_argument("--local_rank", type=int, default=-1)
    parser.add_argument("--deepspeed_config", default=os.path.join(HERE, "ds_config.json"))
    parser.add_argument("--deepspeed_transformer_kernel", action="store_true")
    parser.add_argument("--attention_dropout_checkpoint", action="store_true")
    parser.add_argument("--normalize_invertible", action="store_true")
    parser.add_argument("--gelu_checkpoint", action="store_true")
    parser.add_argument("--pre_layer_norm", action="store_true")
    args = parser.parse_args()
    deepspeed.init_distributed()
    torch.manual_seed(0)
    model = Encoder(args)
    engine, *_ = deepspeed.initialize(model=model, config=args.deepspeed_config,
                                      model_parameters=model.parameters())
    rank, world = deepspeed.comm.get_rank(), deepspeed.comm.get_world_size()
    g = torch.Generator().manual_seed(rank)
    first = last = None
    for step in range(args.steps):
        ids = torch.randint(0, VOCAB, (engine.train_micro_batch_size_per_gpu(), SEQ), generator=g)
        logits = engine(ids.to(engine.device))
        loss = F.cross_entropy(logits[:, 1:].reshape(-1, VOCAB), ids[:, :-1].reshape(-1).to(engine.device))
        engine.backward(loss)
        engine.step()
        last = global_mean(loss.item(), world)
        first = last if first is None else first
        if rank == 0 and (step % 10 == 0 or step == args.steps - 1):
            print(f"step {step:3d}  loss {last:.4f}")
    if rank == 0:
        kind = "DeepSpeedTransformerLayer" if args.deepspeed_transformer_kernel else "BertLayer"
        print(f"{kind}: loss {first:.4f} -> {last:.4f}")
    if not last < 0.5 * first:
        sys.exit(f"the loss did not halve ({first:.4f} -> {last:.4f})")


if __name__ == "__main__":
    main()
