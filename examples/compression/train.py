"""The model-compression tutorial as a runnable example: a small BERT (built from a config, no
downloads) trained on a synthetic classification task with weight quantization (8 -> 6 bits),
50% sparse pruning of the attention projections and 50% row pruning of the FFN, then shrunk by
``redundancy_clean`` and saved as a plain, smaller BERT.

    deepspeed --num_gpus 2 examples/compression/train.py [--steps 160]
              [--deepspeed_config examples/compression/ds_config.json] [--save_dir DIR]

The client code changes are the tutorial's: ``init_compression`` after building the model,
``redundancy_clean`` after training. Rank 0 prints the accuracy of the compressed model before
and after cleaning, the shapes that shrank and the saved sizes; the script then reloads the saved
weights into a plain ``BertForSequenceClassification`` with ``intermediate_size`` halved and
exits non-zero unless its accuracy matches.
"""
import argparse
import json
import os
import sys
import tempfile

import torch

import deepspeed
from deepspeed import comm as dist
from deepspeed.compression.compress import init_compression, redundancy_clean
from deepspeed.compression.export import pack_int8

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from common import require  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
SEQ, VOCAB = 8, 50


def build_bert(intermediate=128):
    require("transformers")
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(0)
    config = BertConfig(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2,
                        num_attention_heads=4, intermediate_size=intermediate,
                        max_position_embeddings=16, num_labels=2, hidden_dropout_prob=0.0,
                        attention_probs_dropout_prob=0.0)
    return BertForSequenceClassification(config)


def synthetic(count, seed):
    """Label 1 when the first token after [CLS] is in the lower half of the vocabulary."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, VOCAB, (count, SEQ), generator=g)
    ids[:, 0] = 0
    return ids, (ids[:, 1] < VOCAB // 2).long()


def accuracy(model, ids, labels):
    model.eval()
    with torch.no_grad():
        return (model(input_ids=ids).logits.argmax(-1) == labels).float().mean().item()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=160)
    parser.add_argument("--deepspeed_config", default=os.path.join(HERE, "ds_config.json"))
    parser.add_argument("--save_dir", default=None)
    parser.add_argument("--local_rank", type=int, default=-1)
    args = parser.parse_args()
    with open(args.deepspeed_config) as handle:
        config = json.load(handle)

    model = init_compression(build_bert(), config)
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                      config=config)
    rank, world = dist.get_rank(), dist.get_world_size()
    micro = engine.train_micro_batch_size_per_gpu()
    ids, labels = synthetic(args.steps * micro * world, seed=1)
    for step in range(args.steps):
        start = (step * world + rank) * micro
        loss = engine(input_ids=ids[start:start + micro], labels=labels[start:start + micro]).loss
        engine.backward(loss)
        engine.step()
        if rank == 0 and (step + 1) % 40 == 0:
            bits = model.bert.encoder.layer[0].attention.self.query.weight_bits
            print(f"step {step + 1}: loss {loss.item():.4f}, weight bits {bits}", flush=True)

    test_ids, test_labels = synthetic(512, seed=2)
    masked_acc = accuracy(model, test_ids, test_labels)
    redundancy_clean(model, config)
    cleaned_acc = accuracy(model, test_ids, test_labels)
    ffn = model.bert.encoder.layer[0].intermediate.dense
    # one directory for every rank (rank 0 writes, all read)
    save_dir = args.save_dir or os.path.join(tempfile.gettempdir(), "ds_compression_example")
    os.makedirs(save_dir, exist_ok=True)
    if rank == 0:
        torch.save(model.state_dict(), os.path.join(save_dir, "cleaned.pt"))
        torch.save(pack_int8(model.state_dict(), num_groups=4,
                             keys=[n for n in model.state_dict() if "encoder" in n
                                   and n.endswith("weight") and model.state_dict()[n].dim() == 2]),
                   os.path.join(save_dir, "cleaned_int8.pt"))
    dist.barrier()
    plain = build_bert(intermediate=ffn.out_features)
    plain.load_state_dict(torch.load(os.path.join(save_dir, "cleaned.pt"), weights_only=True))
    plain_acc = accuracy(plain, test_ids, test_labels)
    if rank == 0:
        sizes = {name: os.path.getsize(os.path.join(save_dir, name)) / 1024
                 for name in ("cleaned.pt", "cleaned_int8.pt")}
        print(f"accuracy: masked {masked_acc:.3f}, cleaned {cleaned_acc:.3f}, reloaded plain "
              f"{plain_acc:.3f}")
        print(f"intermediate.dense {ffn.in_features}x{ffn.out_features} (from 64x128); saved "
              f"{sizes['cleaned.pt']:.0f} KiB fp32, {sizes['cleaned_int8.pt']:.0f} KiB int8")
    engine.destroy()
    ok = plain_acc == cleaned_acc and abs(cleaned_acc - masked_acc) < 1e-6 and cleaned_acc > 0.9
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
