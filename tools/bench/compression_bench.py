"""Model compression: size on disk and CPU inference latency of a BERT after redundancy_clean
(int8 weights, 50% of the FFN rows pruned) against the same BERT dense.

    python tools/bench/compression_bench.py [--hidden 256] [--layers 4] [--batch 8] [--seq 128]
                                            [--repeats 20] [--threads 1]

Both models are built from one ``BertConfig`` (transformers, no downloads) with the same
weights. The compressed one goes through ``init_compression`` (8-bit symmetric weights, groups
of ``--groups``, on every encoder Linear; row pruning keeping 50% of ``intermediate.dense``
rows, with the matching ``output.dense`` columns) and ``redundancy_clean``; it is not trained,
since size and speed do not depend on the values. Sizes: the ``torch.save`` file of each state
dict, the compressed one also with its weights packed as int8 levels + per-group scales
(``deepspeed.compression.export.pack_int8``). Latency: median wall time of ``--repeats``
no-grad forwards after 3 warm-ups, on ``--threads`` CPU threads, contestants interleaved so that
load on a shared machine hits both alike. A tool, not a test.
"""
import argparse
import os
import statistics
import sys
import tempfile
import time

import torch


def bert(hidden, layers, intermediate, vocab=1000, seq=128):
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(0)
    config = BertConfig(vocab_size=vocab, hidden_size=hidden, num_hidden_layers=layers,
                        num_attention_heads=max(1, hidden // 64), intermediate_size=intermediate,
                        max_position_embeddings=seq, num_labels=2)
    config._attn_implementation = "eager"
    return BertForSequenceClassification(config).eval()


def compression_config(groups):
    return {"compression_training": {
        "weight_quantization": {
            "shared_parameters": {"enabled": True, "quantize_weight_in_forward": True,
                                  "quantize_groups": groups},
            "different_groups": {"wq1": {"params": {"start_bits": 8, "target_bits": 8},
                                         "modules": ["encoder"]}}},
        "row_pruning": {
            "shared_parameters": {"enabled": True, "method": "l1"},
            "different_groups": {"rp1": {"params": {"dense_ratio": 0.5},
                                         "modules": ["intermediate.dense"],
                                         "related_modules": [["layer.\\w+.output.dense"]]}}}}}


def file_size(obj, directory, name):
    path = os.path.join(directory, name)
    torch.save(obj, path)
    return os.path.getsize(path)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--groups", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)

    from deepspeed.compression.compress import init_compression, redundancy_clean
    from deepspeed.compression.export import pack_int8

    intermediate = 4 * args.hidden
    dense = bert(args.hidden, args.layers, intermediate, seq=args.seq)
    compressed = bert(args.hidden, args.layers, intermediate, seq=args.seq)
    config = compression_config(args.groups)
    init_compression(compressed, config)
    redundancy_clean(compressed, config)
    encoder_weights = [name for name, t in compressed.state_dict().items()
                       if "encoder" in name and name.endswith(".weight") and t.dim() == 2]

    ids = torch.randint(0, 1000, (args.batch, args.seq),
                        generator=torch.Generator().manual_seed(0))
    with tempfile.TemporaryDirectory() as tmp:
        sizes = {
            "dense fp32": file_size(dense.state_dict(), tmp, "dense.pt"),
            "cleaned fp32": file_size(compressed.state_dict(), tmp, "cleaned.pt"),
            "cleaned int8": file_size(pack_int8(compressed.state_dict(), args.groups,
                                                keys=encoder_weights), tmp, "int8.pt"),
        }
    times = {"dense": [], "cleaned": []}
    with torch.no_grad():
        for model in (dense, compressed):
            for _ in range(3):
                model(input_ids=ids)
        for _ in range(args.repeats):
            for name, model in (("dense", dense), ("cleaned", compressed)):
                start = time.perf_counter()
                model(input_ids=ids)
                times[name].append(time.perf_counter() - start)

    print(f"BERT hidden {args.hidden}, {args.layers} layers, FFN {intermediate} -> "
          f"{intermediate // 2}; batch {args.batch} x seq {args.seq}; "
          f"{args.threads} threads; torch {torch.__version__}")
    print(f"{'model':<16}{'size MiB':>10}{'vs dense':>10}")
    for name, size in sizes.items():
        print(f"{name:<16}{size / 2 ** 20:>10.2f}{size / sizes['dense fp32']:>10.2f}")
    print(f"{'model':<16}{'median ms':>10}{'speed-up':>10}")
    dense_ms = statistics.median(times["dense"]) * 1e3
    for name, samples in times.items():
        ms = statistics.median(samples) * 1e3
        print(f"{name:<16}{ms:>10.1f}{dense_ms / ms:>10.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
