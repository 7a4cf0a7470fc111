"""Inference with AutoTP: greedy generation tokens/s and per-rank weight memory of a tiny Llama
(~99M parameters: vocabulary 32000, hidden 768, 7 layers, MLP 2048), in one run:

- plain Hugging Face ``generate`` (no DeepSpeed), one process;
- ``deepspeed.init_inference`` with tp_size 1, one process;
- ``deepspeed.init_inference`` with tp_size 2 on 2 gloo CPU ranks (``deepspeed.testing``'s pool;
  embeddings and LM head split by vocabulary, blocks by AutoTP);
- the same, the model built with ``empty_init()`` (parameters on the meta device) and its
  weights loaded with ``checkpoint=`` from a saved state dict: no rank ever holds the whole
  model, which the peak RSS column shows.

    python tools/bench/inference_bench.py [--new_tokens 32 --prompt 16 --batch 1 --threads 1]

Weight memory is the bytes of the parameters a rank holds (``sharding.parameter_bytes``), not
an estimate; "anon RSS" is each process's private resident memory after generating (fresh
processes for each TP 2 run; libraries included, the checkpoint's page cache not). Tokens/s: generated tokens (batch x
new tokens) over the wall time of one ``generate`` after a warm-up call, the slowest rank for
TP 2. Exits non-zero when TP 2's per-rank weight memory is above 0.55x TP 1's or the TP 2
tokens differ from plain generate's. A tool, never a test: nothing in the test suite times
anything.
"""
import argparse
import os
import resource
import sys
import tempfile
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
    """This process's private (anonymous) resident memory now, in MiB: the weights, the
    activations and the libraries' heaps, not the checkpoint file's shared page-cache pages."""
    with open("/proc/self/status") as handle:
        for line in handle:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _run(tp_size, args, plain=False):
    """One rank's figures (also the single-process runs)."""
    import deepspeed
    from deepspeed.inference.sharding import parameter_bytes

    torch.set_num_threads(args["threads"])
    if args.get("checkpoint"):
        from deepspeed.inference.checkpoint import empty_init

        with empty_init():
            model = _model()
        full = sum(p.numel() * p.element_size() for p in model.parameters())
        engine = deepspeed.init_inference(model, dtype=torch.float, checkpoint=args["checkpoint"],
                                          tensor_parallel={"tp_size": tp_size})
        out, tps = _generate(engine.generate, _prompt(args), args["new_tokens"])
        return {"tokens": out, "tps": tps, "weights": parameter_bytes(engine.module),
                "full": full, "rss": _rss_mib(),
                "peak": engine.checkpoint_stats["peak_param_bytes"]}
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
    from deepspeed.testing.distributed import DistributedPool

    plain = _run(1, args, plain=True)
    tp1 = _run(1, args)
    with DistributedPool(2) as pool:  # fresh processes for each run
        tp2 = pool.run(_run_tp2, timeout=3000, args=(args,))
    with tempfile.TemporaryDirectory() as tmp:
        from safetensors.torch import save_file

        path = os.path.join(tmp, "model.safetensors")
        save_file(_model().state_dict(), path)
        with DistributedPool(2) as pool:
            loaded = pool.run(_run_tp2, timeout=3000, args=(dict(args, checkpoint=path),))
    mib = 2 ** 20
    print(f"tiny Llama: {plain['full'] / 4 / 1e6:.1f}M parameters (fp32), batch {args['batch']}, "
          f"prompt {args['prompt']}, {args['new_tokens']} new tokens, {args['threads']} "
          f"thread(s) per process")
    print(f"{'setup':<22}{'tokens/s':>10}{'weights/rank MiB':>18}{'anon RSS/rank MiB':>19}")
    print(f"{'HF generate':<22}{plain['tps']:>10.1f}{plain['weights'] / mib:>18.1f}"
          f"{plain['rss']:>19.0f}")
    print(f"{'init_inference TP 1':<22}{tp1['tps']:>10.1f}{tp1['weights'] / mib:>18.1f}"
          f"{tp1['rss']:>19.0f}")
    slowest = min(r["tps"] for r in tp2)
    heaviest = max(r["weights"] for r in tp2)
    print(f"{'init_inference TP 2':<22}{slowest:>10.1f}{heaviest / mib:>18.1f}"
          f"{max(r['rss'] for r in tp2):>19.0f}")
    print(f"{'TP 2, checkpoint=':<22}{min(r['tps'] for r in loaded):>10.1f}"
          f"{max(r['weights'] for r in loaded) / mib:>18.1f}"
          f"{max(r['rss'] for r in loaded):>19.0f}")
    print(f"checkpoint= loading: peak real parameter bytes per rank "
          f"{max(r['peak'] for r in loaded) / mib:.1f} MiB "
          f"({max(r['peak'] for r in loaded) / tp1['weights']:.3f} of the whole model)")
    ratio = heaviest / tp1["weights"]
    same = all(torch.equal(r["tokens"], plain["tokens"]) for r in tp2 + loaded + [tp1])
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
