"""Inference: AutoTP on CPU ranks (default), or kernel injection with CUDA graphs on one GPU
(``--cuda-graph``).

``--cuda-graph``: a ~1.1B-parameter Llama (TinyLlama-1.1B's shape: vocabulary 32000, hidden 2048,
22 layers, 32 heads, 4 key/value heads, MLP 5632) with random weights built from a
``LlamaConfig`` (nothing downloaded), fp16, greedy decoding of ``--new_tokens`` tokens at batch 1
and 8: Hugging Face eager ``generate`` against ``init_inference(replace_with_kernel_inject=True,
enable_cuda_graph=True)``'s ``generate``, tokens/s of each (one call after a warm-up call that
also captures the graph), whether the tokens are identical (and where not, the first differing
position and Hugging Face's own top-2 logit gap there: a near-tie that reassociation can flip),
and the same decoding step run eagerly against the replayed graph (bitwise the same). Then the
weight-only int8 engine (``dtype=torch.int8``): its quantized layers' int8 codes against their
fp32 and fp16 bytes (exactly 1/4 and 1/2), the scales on top, and the GPU memory the whole model
holds before and after. ``--dry-run``: the same at a tiny size on CPU, where
``enable_cuda_graph`` is refused (the refusal is recorded) and the decoding step runs eagerly.

    python tools/bench/inference_bench.py --cuda-graph [--new_tokens 64 --prompt 32]
    python tools/bench/inference_bench.py --cuda-graph --dry-run

Default (AutoTP): greedy generation tokens/s and per-rank weight memory of a tiny Llama
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


LLAMA_1B = dict(vocab_size=32000, hidden_size=2048, intermediate_size=5632, num_hidden_layers=22,
                num_attention_heads=32, num_key_value_heads=4, max_position_embeddings=2048)
LLAMA_TINY = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)


def _llama(device, dtype, tiny):
    import transformers as tf

    torch.manual_seed(0)
    with torch.device(device):  # random init on the GPU: seconds, not minutes on the host
        model = tf.LlamaForCausalLM(tf.LlamaConfig(**(LLAMA_TINY if tiny else LLAMA_1B)))
    model.generation_config.eos_token_id = None  # random weights: no token means "stop"
    return model.to(dtype).eval()


def _timed_generate(fn, ids, new_tokens):
    """(tokens, tokens/s) of one greedy call after a warm-up call of the same shape."""
    kwargs = dict(attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens,
                  min_new_tokens=new_tokens, do_sample=False, pad_token_id=0)
    with torch.no_grad():
        fn(ids, **kwargs)  # warm-up (and, with CUDA graphs, the capture)
        if ids.is_cuda:
            torch.cuda.synchronize()
        start = time.perf_counter()
        out = fn(ids, **kwargs)
        if ids.is_cuda:
            torch.cuda.synchronize()
        seconds = time.perf_counter() - start
    return out, ids.shape[0] * new_tokens / seconds


def _first_difference(model, want, got, prompt):
    """Where two greedy outputs first differ, and the reference's top-2 logit gap there."""
    diff = (want != got).nonzero()
    if diff.numel() == 0:
        return None
    row, col = (int(v) for v in diff[0])
    with torch.no_grad():
        logits = model(want[row:row + 1, :col]).logits[0, -1].float()
    top = logits.topk(2).values
    return {"row": row, "new_token": col - prompt, "hf_top2_gap": float(top[0] - top[1]),
            "hf_top1_logit": float(top[0])}


def _int8_memory(device, dtype, tiny):
    """Bytes of the quantized layers (fp32, fp16, int8 codes, scales) and of the whole model."""
    import deepspeed
    from deepspeed.inference.quantize import int8_parts

    def allocated():
        return torch.cuda.memory_allocated() if device.type == "cuda" else None

    before = allocated()
    model = _llama(device, dtype, tiny)
    with_model = allocated()
    engine = deepspeed.init_inference(model, dtype=torch.int8)
    after = allocated()
    numel = codes = scales = 0
    for module in engine.module.modules():
        parts = int8_parts(module)
        if parts is not None:
            numel += parts[0].numel()
            codes += parts[0].numel() * parts[0].element_size()
            scales += sum(t.numel() * t.element_size() for t in parts[1:] if t is not None)
    figures = {"int8_layers_fp32_bytes": 4 * numel, "int8_layers_fp16_bytes": 2 * numel,
               "int8_codes_bytes": codes, "int8_scales_bytes": scales,
               "int8_codes_vs_fp32": codes / (4 * numel), "int8_codes_vs_fp16": codes / (2 * numel)}
    if before is not None:
        figures.update(model_fp16_gpu_bytes=with_model - before,
                       model_int8_gpu_bytes=after - before,
                       model_int8_vs_fp16_gpu=(after - before) / (with_model - before))
    del engine, model
    return figures


def graph_main(args):
    """``--cuda-graph``: see the module doc."""
    import deepspeed
    from bench_figures import emit, target
    from deepspeed.inference.cuda_graph import CACHE_ROUND, CudaGraphError, GreedyDecoder

    on_gpu = torch.cuda.is_available() and not args["dry_run"]
    if not on_gpu and not args["dry_run"]:
        sys.exit("inference_bench --cuda-graph: needs a CUDA GPU (or --dry-run)")
    device = torch.device("cuda" if on_gpu else "cpu")
    dtype = torch.float16 if on_gpu else torch.float32
    tiny = args["dry_run"]
    new, length = (4, 6) if tiny else (args["new_tokens"], args["prompt"])
    model = _llama(device, dtype, tiny)
    params = sum(p.numel() for p in model.parameters())
    print(f"Llama {params / 1e9:.2f}B parameters, {dtype}, {device}, prompt {length}, "
          f"{new} new tokens")
    vocab = model.config.vocab_size
    g = torch.Generator().manual_seed(1)
    prompts = {b: torch.randint(1, vocab, (b, length), generator=g).to(device) for b in (1, 8)}
    hf = {b: _timed_generate(model.generate, ids, new) for b, ids in prompts.items()}
    figures, targets = {"params": params, "new_tokens": new, "prompt": length}, {}
    try:
        engine = deepspeed.init_inference(model, dtype=dtype, replace_with_kernel_inject=True,
                                          enable_cuda_graph=True)
        ours = {b: _timed_generate(engine.generate, ids, new) for b, ids in prompts.items()}
    except CudaGraphError as err:  # the CPU refusal (a dry run), or a capture that failed
        figures["cuda_graph_error"] = str(err)
        print(f"enable_cuda_graph: {err}")
        engine, ours = None, {}
    for b, ids in prompts.items():
        hf_tokens, hf_tps = hf[b]
        figures[f"b{b}_hf_tokens_per_s"] = hf_tps
        cache_len = -(-(length + new) // CACHE_ROUND) * CACHE_ROUND  # the engine's
        decoder = GreedyDecoder(model, b, cache_len, (), capture=False)
        with torch.no_grad():
            eager = decoder.generate(ids, new, new, 0)
        figures[f"b{b}_static_eager_same_as_hf"] = bool(torch.equal(eager, hf_tokens))
        line = f"batch {b}: HF eager generate {hf_tps:8.1f} tokens/s"
        if b in ours:
            tokens, tps = ours[b]
            same = bool(torch.equal(tokens, hf_tokens))
            figures.update({f"b{b}_graph_tokens_per_s": tps, f"b{b}_speedup": tps / hf_tps,
                            f"b{b}_identical_tokens": same,
                            f"b{b}_graph_same_as_eager_step": bool(torch.equal(tokens, eager))})
            if not same:
                figures[f"b{b}_first_difference"] = _first_difference(model, hf_tokens, tokens,
                                                                      length)
            targets[f"inference_b{b}_speedup_vs_hf_eager"] = target(tps / hf_tps, ">=", 1.5)
            targets[f"inference_b{b}_identical_tokens"] = target(float(same), ">=", 1.0)
            line += (f"; kernel inject + CUDA graph {tps:8.1f} tokens/s ({tps / hf_tps:.2f}x), "
                     f"tokens identical: {same}, replay == eager step: "
                     f"{figures[f'b{b}_graph_same_as_eager_step']}")
        print(line + f"; static-cache eager step == HF: {figures[f'b{b}_static_eager_same_as_hf']}")
    del engine, model
    if on_gpu:
        torch.cuda.empty_cache()
    int8 = _int8_memory(device, dtype, tiny)
    figures.update(int8)
    targets["int8_codes_quarter_of_fp32"] = target(abs(int8["int8_codes_vs_fp32"] - 0.25), "<=",
                                                   0.0)
    print(f"int8 weight-only: quantized layers {int8['int8_layers_fp32_bytes'] / 2**20:.1f} MiB "
          f"fp32 / {int8['int8_layers_fp16_bytes'] / 2**20:.1f} MiB fp16 -> int8 codes "
          f"{int8['int8_codes_bytes'] / 2**20:.1f} MiB ({int8['int8_codes_vs_fp32']:.4f} of fp32, "
          f"{int8['int8_codes_vs_fp16']:.4f} of fp16) + scales "
          f"{int8['int8_scales_bytes'] / 2**20:.2f} MiB"
          + (f"; whole model on the GPU {int8['model_fp16_gpu_bytes'] / 2**20:.0f} MiB fp16 -> "
             f"{int8['model_int8_gpu_bytes'] / 2**20:.0f} MiB int8 "
             f"({int8['model_int8_vs_fp16_gpu']:.3f}; embeddings and norms stay fp16)"
             if "model_int8_gpu_bytes" in int8 else ""))
    emit(args["json"], "inference", figures, targets, dry_run=args["dry_run"])
    return 0


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--new_tokens", type=int, default=32)
    parser.add_argument("--prompt", type=int, default=16)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--threads", type=int, default=1, help="torch threads per process")
    parser.add_argument("--cuda-graph", action="store_true",
                        help="the one-GPU kernel-injection + CUDA-graph benchmark (module doc)")
    parser.add_argument("--dry-run", action="store_true", help="--cuda-graph at a tiny size on CPU")
    parser.add_argument("--json", default=None, help="--cuda-graph: append the figures here")
    args = vars(parser.parse_args(argv))
    if args["cuda_graph"]:
        if args["new_tokens"] == 32 and args["prompt"] == 16:  # the AutoTP defaults
            args["new_tokens"], args["prompt"] = 64, 32
        return graph_main(args)
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
