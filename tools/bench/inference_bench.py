"""Inference with AutoTP: greedy generation tokens/s and per-rank weight memory of a tiny Llama
(~99M parameters: vocabulary 32000, hidden 768, 7 layers, MLP 2048), in one run:

- plain Hugging Face ``generate`` (no DeepSpeed), one process;
- ``deepspeed.init_inference`` with tp_size 1, one process;
- ``deepspeed.init_inference`` with tp_size 2 on 2 gloo CPU ranks (``deepspeed.testing``'s pool;
  embeddings and LM head split by vocabulary, blocks by AutoTP).

    python tools/bench/inference_bench.py [--new_tokens 32 --prompt 16 --batch 1 --threads 1]

Weight memory is the bytes of the parameters a rank holds (``sharding.parameter_bytes``), not
an estimate; peak RSS is ``ru_maxrss`` of each process. Tokens/s: generated tokens (batch x
new tokens) over the wall time of one ``generate`` after a warm-up call, the slowest rank for
TP 2. Exits non-zero when TP 2's per-rank weight memory is above 0.55x TP 1's or the TP 2
tokens differ from plain generate's. A tool, never a test: nothing in the test suite times
anything.
"""
import argparse
import resource
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE)]

CONFIG = dict(vocab_size=32000, hidden_size=768, intermediate_size=2048, num_hidden_layers=7,
              num_attention_heads=12, num_key_value_heads=12, max_position_embeddings=512)


def _model():
    import transformers as tf

    torch.manual_seed(0)
    return tf.LlamaForCausalLM(tf.LlamaConfig(**CONFIG)).eval()


def _prompt(args):
    g = torch.Generator().manual_seed(1)
    return torch.randint(0, CONFIG["vocab_size"], (args["batch"], args["prompt"]), generator=g)


def _generate(fn, ids, new_tokens):
    kwargs = dict(max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False,
                  pad_token_id=0)
    with torch.no_grad():
        fn(ids, **dict(kwargs, max_new_tokens=2, min_new_tokens=2))  # warm-up
        start = time.perf_counter()
        out = fn(ids, **kwargs)
        seconds = time.perf_counter() - start
    return out, ids.shape[0] * new_tokens / seconds


def _rss_mib():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _run(tp_size, args, plain=False):
    """One rank's figures (also the single-process runs)."""
    import deepspeed
    from deepspeed.inference.sharding import parameter_bytes

    torch.set_num_threads(args["threads"])
    model = _model()
    full = parameter_bytes(model)
    ids = _prompt(args)
    if plain:
        out, tps = _generate(model.generate, ids, args["new_tokens"])
        return {"tokens": out, "tps": tps, "weights": full, "full": full, "rss": _rss_mib()}
    engine = deepspeed.init_inference(model, dtype=torch.float,
                                      tensor_parallel={"tp_size": tp_size})
    out, tps = _generate(engine.generate, ids, args["new_tokens"])
    return {"tokens": out, "tps": tps, "weights": parameter_bytes(engine.module), "full": full,
            "rss": _rss_mib()}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--new_tokens", type=int, default=32)
    parser.add_argument("--prompt", type=int, default=16)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--threads", type=int, default=1, help="torch threads per process")
    args = vars(parser.parse_args(argv))
    from deepspeed.testing.distributed import run_distributed

    plain = _run(1, args, plain=True)
    tp1 = _run(1, args)
    tp2 = run_distributed(_run_tp2, world_size=2, timeout=3000, args=(args,))
    mib = 2 ** 20
    print(f"tiny Llama: {plain['full'] / 4 / 1e6:.1f}M parameters (fp32), batch {args['batch']}, "
          f"prompt {args['prompt']}, {args['new_tokens']} new tokens, {args['threads']} "
          f"thread(s) per process")
    print(f"{'setup':<22}{'tokens/s':>10}{'weights/rank MiB':>18}{'peak RSS/rank MiB':>19}")
    print(f"{'HF generate':<22}{plain['tps']:>10.1f}{plain['weights'] / mib:>18.1f}"
          f"{plain['rss']:>19.0f}")
    print(f"{'init_inference TP 1':<22}{tp1['tps']:>10.1f}{tp1['weights'] / mib:>18.1f}"
          f"{tp1['rss']:>19.0f}")
    slowest = min(r["tps"] for r in tp2)
    heaviest = max(r["weights"] for r in tp2)
    print(f"{'init_inference TP 2':<22}{slowest:>10.1f}{heaviest / mib:>18.1f}"
          f"{max(r['rss'] for r in tp2):>19.0f}")
    ratio = heaviest / tp1["weights"]
    same = all(torch.equal(r["tokens"], plain["tokens"]) for r in tp2 + [tp1])
    print(f"TP 2 / TP 1 per-rank weight memory: {ratio:.3f} (target <= 0.55)")
    print(f"tokens/s TP 1 / HF generate: {tp1['tps'] / plain['tps']:.2f}; "
          f"TP 2 / TP 1: {slowest / tp1['tps']:.2f}")
    print(f"greedy tokens identical to HF generate: {same}")
    return 0 if ratio <= 0.55 and same else 1


def _run_tp2(args):
    return _run(2, args)


if __name__ == "__main__":
    import inference_bench  # ranks find the workers by module name, not __main__

    sys.exit(inference_bench.main())
