"""Train a small Hugging Face BERT with block-sparse self-attention.

The model is built from a config (no download), its self-attention layers are replaced with
``SparseSelfAttention`` using the pattern of ``ds_config.json``'s ``sparse_attention``
section, and inputs of any length are padded to the block size and the outputs cut back.

    deepspeed --num_gpus 2 examples/sparse_attention/train.py     # or: python ... (1 process)
"""
import argparse
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from common import global_mean, positive_int, require  # noqa: E402

require("transformers")
import transformers  # noqa: E402

import deepspeed  # noqa: E402
from deepspeed.ops.sparse_attention import SparseAttentionUtils  # noqa: E402
from deepspeed.sparse_attention import get_sparse_attention_config  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
VOCAB, SEQ = 100, 100


def build_model(config_path, max_position):
    config = transformers.BertConfig(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2,
                                     num_attention_heads=4, intermediate_size=128,
                                     max_position_embeddings=128, attn_implementation="eager")
    model = transformers.BertForMaskedLM(config)
    sparsity = get_sparse_attention_config(config_path, config.num_attention_heads)
    SparseAttentionUtils.extend_position_embedding(model, max_position)
    return SparseAttentionUtils.replace_model_self_attention_with_sparse_self_attention(
        model, max_position, sparsity), sparsity.block


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=positive_int, default=20)
    parser.add_argument("--local_rank", type=int, default=-1)
    parser.add_argument("--deepspeed_config", default=os.path.join(HERE, "ds_config.json"))
    args = parser.parse_args()
    deepspeed.init_distributed()
    torch.manual_seed(0)
    model, block = build_model(args.deepspeed_config, max_position=256)
    engine, *_ = deepspeed.initialize(model=model, config=args.deepspeed_config,
                                      model_parameters=model.parameters())
    rank, world = deepspeed.comm.get_rank(), deepspeed.comm.get_world_size()
    g = torch.Generator().manual_seed(rank)
    first = last = None
    for step in range(args.steps):
        ids = torch.randint(2, VOCAB, (2, SEQ), generator=g)
        ids[:, 1::2] = ids[:, ::2]  # learnable: every odd token repeats the one before
        mask = torch.ones_like(ids)
        pad_len, ids_in, mask_in, _, _, _ = SparseAttentionUtils.pad_to_block_size(
            block, ids, mask, None, None, None, 0, None)
        logits = engine(input_ids=ids_in, attention_mask=mask_in).logits
        logits = SparseAttentionUtils.unpad_sequence_output(pad_len, logits)
        loss = F.cross_entropy(logits[:, :-1].reshape(-1, VOCAB), ids[:, 1:].reshape(-1))
        engine.backward(loss)
        engine.step()
        mean = global_mean(loss.item(), world)
        first = mean if first is None else first
        last = mean
        if rank == 0 and (step % 5 == 0 or step == args.steps - 1):
            print(f"step {step:3d}  loss {mean:.4f}  (seq {SEQ} padded by {pad_len} to {SEQ + pad_len})")
    if rank == 0:
        print(f"loss {first:.4f} -> {last:.4f}")


if __name__ == "__main__":
    main()
