"""ZeRO-Offload on one GPU: ZeRO-2 with ``offload_optimizer: cpu`` (pinned) against the same
training with everything on the GPU, sized from the machine it runs on.

    python tools/bench/zero_offload_bench.py                 # on a GPU machine
    python tools/bench/zero_offload_bench.py --dry-run       # tiny sizes on this machine (CPU)

The model is the examples' GPT (``examples/gpt.py``) at width ``--n_embd`` (default 4096, 32
heads); only its depth changes. Sizes come from memory arithmetic, not from trying ever larger
models until one fails:

1. probes: one process per configuration (all on the GPU, CPU offload, NVMe offload) trains
   a two-layer then a one-layer model for two steps each: the difference between their GPU
   peaks (the caching allocator's) is what a layer costs on the GPU, the rest is the fixed
   cost (embeddings, logits); the two-layer model's host state (resident set added by the
   model, engine and optimizer state) and swap files give bytes per parameter on the host and
   on the NVMe directory;
2. the deepest model each configuration fits: free GPU memory (and host RAM, and the NVMe
   directory's free space) x ``--margin``, less the fixed cost, over the per-layer cost;
3. timed runs (``--steps`` optimizer steps after ``--warmup``, each of ``--gas`` micro-batches of
   ``--micro`` x ``--seq`` tokens, bf16, gradients accumulated in fp32): all-on-GPU and CPU
   offload at the deepest model both fit (the ratio the issue's 0.7x target is about), and CPU
   offload at a model deeper than all-on-GPU fits (its fp32 Adam state does not fit the GPU);
4. the largest trainable parameter count with CPU offload and with NVMe offload, computed from
   (2), the NVMe probe (last, the figure the budget gives up first) showing the path works
   (``--verify-largest`` also trains one step at the CPU-offload maximum).

Figures: samples/s, tokens/s, achieved TFLOPS (6 x params + 12 x layers x seq x width FLOPs per
token), peak GPU and host memory, the offload/all-on-GPU ratio and where each step's time goes
(forward, backward, optimizer step). Every configuration runs in its own process, so an
out-of-memory in one leaves the others' figures, and its memory peaks are its own. The last
line is one JSON object of every figure (``--json`` writes it to a file too). A tool, never a
test: nothing asserts on time.
"""
import argparse
import json
import math
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parents[1] / "examples")]


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dry-run", action="store_true",
                   help="tiny sizes on whatever device this machine has (CPU here): checks the "
                        "tool end to end, measures nothing of interest")
    p.add_argument("--n_embd", type=int, default=4096)
    p.add_argument("--head_dim", type=int, default=128)
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--micro", type=int, default=4)
    p.add_argument("--gas", type=int, default=8, help="micro-batches per optimizer step")
    p.add_argument("--steps", type=int, default=2, help="timed optimizer steps")
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--margin", type=float, default=0.9,
                   help="fraction of free GPU memory / host RAM / disk a model may plan to use")
    p.add_argument("--nvme_dir", default=None,
                   help="swap directory for NVMe offload (default: a fresh one under the "
                        "system temp dir, i.e. the machine's local disk)")
    p.add_argument("--host_gib", type=float, default=None,
                   help="host RAM to plan with when the machine reports less available (a VM "
                        "whose memory grows as it is used); default: what psutil reports")
    p.add_argument("--budget", type=float, default=600,
                   help="seconds: runs that would start after this are skipped, and said so")
    p.add_argument("--nvme", action="store_true",
                   help="with --dry-run: also the NVMe runs (they build the async_io op first)")
    p.add_argument("--verify-largest", action="store_true",
                   help="also train one step at the largest CPU-offload size (slow: pins most "
                        "of the host's memory)")
    p.add_argument("--json", default=None, help="append the figures record to this file")
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.dry_run:
        args.n_embd, args.head_dim, args.vocab, args.seq = 64, 16, 128, 32
        args.micro, args.gas, args.steps, args.warmup = 2, 2, 1, 1
        # the PyTorch path of the CPU optimizer: checking the tool needs no native build
        os.environ.setdefault("DS_CPU_OPTIMIZER_FALLBACK", "1")
    return args


# ---------------------------------------------------------------------- one configuration
def _layer_params(d):
    return 12 * d * d + 13 * d  # qkv + proj + 2 MLP matrices, their biases, two LayerNorms


def model_params(args, layers):
    d = args.n_embd
    return args.vocab * d + args.seq * d + layers * _layer_params(d) + 2 * d


def flops_per_token(args, layers):
    return 6 * model_params(args, layers) + 12 * layers * args.seq * args.n_embd


def _zero_config(offload, nvme_dir, on_gpu):
    zero = {"stage": 2, "overlap_comm": True, "contiguous_gradients": True,
            "reduce_bucket_size": 200_000_000}
    if offload == "cpu":
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": on_gpu}
    elif offload == "nvme":
        zero["offload_optimizer"] = {"device": "nvme", "nvme_path": nvme_dir,
                                     "pin_memory": on_gpu}
    return zero


def _dir_bytes(path):
    return sum(f.stat().st_size for f in Path(path).rglob("*") if f.is_file())


def run_child(spec):
    """Train ``spec`` (a dict: layers, offload, nvme_dir, args) and return its figures; with a
    list of depths, one result per depth, trained one after the other in this process."""
    import torch

    from deepspeed.testing import find_free_port

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(find_free_port()))
    for key, value in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1"),
                       ("LOCAL_WORLD_SIZE", "1")):
        os.environ.setdefault(key, value)
    if not isinstance(spec["layers"], list):
        return train_once(spec, spec["layers"])
    results = []
    for layers in spec["layers"]:
        results.append(train_once(spec, layers))
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
    return results


def train_once(spec, layers):
    """One model of ``layers`` layers trained as ``spec`` says: its figures. Host memory is the
    resident set the model, engine and optimizer state added (psutil, before and after), so
    only the first run of a process measures it (torch keeps freed pinned memory cached)."""
    import psutil
    import torch

    import deepspeed
    from gpt import GPT, GPTConfig

    a = argparse.Namespace(**spec["args"])
    offload = spec["offload"]
    rss_before = psutil.Process().memory_info().rss
    on_gpu = torch.cuda.is_available()
    device = torch.device("cuda" if on_gpu else "cpu")
    dtype = torch.bfloat16 if on_gpu else torch.float32
    torch.manual_seed(0)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)  # built in bf16 on the GPU: no fp32 copy of a large model
    try:
        with device:
            model = GPT(GPTConfig(vocab_size=a.vocab, block_size=a.seq, n_layer=layers,
                                  n_head=a.n_embd // a.head_dim, n_embd=a.n_embd))
    finally:
        torch.set_default_dtype(previous)
    config = {"train_micro_batch_size_per_gpu": a.micro, "gradient_accumulation_steps": a.gas,
              "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "weight_decay": 0.0}},
              "zero_optimization": _zero_config(offload, spec.get("nvme_dir"), on_gpu),
              "steps_per_print": 10 ** 9}
    if on_gpu:
        config["bf16"] = {"enabled": True}
        config["data_types"] = {"grad_accum_dtype": "fp32"}
    start = time.perf_counter()
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                      config=config)
    init_s = time.perf_counter() - start
    g = torch.Generator(device=device).manual_seed(1)
    tokens = torch.randint(0, a.vocab, (a.gas, a.micro, a.seq + 1), device=device, generator=g)

    def sync():
        if on_gpu:
            torch.cuda.synchronize()

    phases = {"forward": 0.0, "backward": 0.0, "step": 0.0}
    step_times, losses = [], []
    for step in range(a.warmup + a.steps):
        timed = step >= a.warmup
        sync()
        step_start = time.perf_counter()
        for micro in range(a.gas):
            t0 = time.perf_counter()
            loss = engine(tokens[micro, :, :-1], tokens[micro, :, 1:])
            sync()
            t1 = time.perf_counter()
            engine.backward(loss)
            sync()
            t2 = time.perf_counter()
            engine.step()
            sync()
            t3 = time.perf_counter()
            if timed:
                phases["forward"] += t1 - t0
                phases["backward"] += t2 - t1
                phases["step"] += t3 - t2
        losses.append(float(loss))
        if timed:
            step_times.append(time.perf_counter() - step_start)
    step_s = sum(step_times) / len(step_times)
    samples = a.micro * a.gas
    result = {
        "layers": layers, "offload": offload, "params": model_params(a, layers),
        "init_s": init_s, "step_s": step_s, "samples_per_s": samples / step_s,
        "tokens_per_s": samples * a.seq / step_s,
        "tflops": flops_per_token(a, layers) * samples * a.seq / step_s / 1e12,
        "phases_s": {k: v / a.steps for k, v in phases.items()},
        "loss_first": losses[0], "loss_last": losses[-1], "device": str(device),
        "peak_host_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "host_state_bytes": psutil.Process().memory_info().rss - rss_before,
    }
    if on_gpu:
        result["peak_gpu_bytes"] = torch.cuda.max_memory_allocated()
    if offload == "nvme":
        result["nvme_bytes"] = _dir_bytes(spec["nvme_dir"])
    engine.destroy()
    del engine, model
    return result


def measure(spec, timeout, in_process=False):
    """``run_child(spec)`` in a fresh process (or this one: a dry run): its figures, or
    {"error": ...}."""
    if in_process:
        try:
            return run_child(spec)
        except Exception as err:  # reported in the table, as a child's failure would be
            return {"layers": spec["layers"], "offload": spec["offload"],
                    "error": f"{type(err).__name__}: {err}"}
    cmd = [sys.executable, __file__, "--child", json.dumps(spec)]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=max(timeout, 1))
    except subprocess.TimeoutExpired:
        return {"layers": spec["layers"], "offload": spec["offload"],
                "error": f"timed out after {timeout:.0f} s"}
    lines = [line for line in proc.stdout.splitlines() if line.startswith(("{", "["))]
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        return {"layers": spec["layers"], "offload": spec["offload"],
                "error": " | ".join(tail) or f"exit code {proc.returncode}"}
    return json.loads(lines[-1])


# ---------------------------------------------------------------------- sizing
def machine(args):
    """Free GPU memory, host RAM and NVMe-directory space this run may plan with."""
    import psutil
    import torch

    available = psutil.virtual_memory().available
    info = {"host_available": max(available, (args.host_gib or 0) * 2**30),
            "host_reported_available": available, "host_total": psutil.virtual_memory().total,
            "disk_free": shutil.disk_usage(args.nvme_dir).free}
    if torch.cuda.is_available():
        free, total = torch.cuda.mem_get_info()
        info.update(gpu=torch.cuda.get_device_name(), gpu_free=free, gpu_total=total,
                    torch=torch.__version__, cuda=torch.version.cuda)
    else:
        info.update(gpu=None, torch=torch.__version__)
    return info


def deepest(budget_bytes, fixed, layer):
    return max(int((budget_bytes - fixed) // max(layer, 1)), 0)


def per_param_deepest(args, budget_bytes, probe, key):
    """The deepest model whose ``key`` bytes (host state, swap files), at the probe's bytes per
    parameter, fit the budget: a conservative reading (the probe's fixed cost counts per
    parameter too)."""
    per_param = probe[key] / probe["params"]
    fixed = model_params(args, 0) * per_param
    return deepest(budget_bytes, fixed, _layer_params(args.n_embd) * per_param)


def affordable_layers(args, probes, seconds_left):
    """The deepest model whose all-on-GPU and CPU-offload timed runs, at the probes' seconds
    (initialisation + one micro-batch step each, linear in the depth), end within 80% of
    ``seconds_left``; None when a probe has no timing."""
    def line(results, key):
        two, one = results
        if "error" in two or "error" in one:
            return None
        per_layer = max(two[key] - one[key], 0.0)
        return one[key] - per_layer, per_layer  # fixed, per layer

    micro_steps = (args.warmup + args.steps) * args.gas
    fixed = per_layer = 0.0
    for offload in ("none", "cpu"):
        init, step = line(probes[offload], "init_s"), line(probes[offload], "step_s")
        if init is None or step is None:
            return None
        fixed += init[0] + micro_steps * step[0] + 15  # + process and CUDA start
        per_layer += init[1] + micro_steps * step[1]
    return max(int((0.8 * seconds_left - fixed) // max(per_layer, 1e-9)), 1)


def plan(args, info, probes):
    """The deepest model each configuration fits, from the probes (see the module doc)."""
    gpu_budget = info.get("gpu_free", 0) * args.margin
    host_budget = info["host_available"] * args.margin
    disk_budget = info["disk_free"] * args.margin
    limits = {}
    for offload, results in probes.items():
        failed = results if isinstance(results, dict) else next(
            (r for r in results if "error" in r), None)
        if failed is not None:
            limits[offload] = {"error": failed.get("error", "probe failed")}
            continue
        two, one = results  # the deeper model first: its host bytes are the clean reading
        bounds = {}
        if "peak_gpu_bytes" in one:
            layer = two["peak_gpu_bytes"] - one["peak_gpu_bytes"]
            bounds["gpu"] = deepest(gpu_budget, one["peak_gpu_bytes"] - layer, layer)
        if offload != "none":
            bounds["host"] = per_param_deepest(args, host_budget, two, "host_state_bytes")
        if offload == "nvme":
            bounds["nvme"] = per_param_deepest(args, disk_budget, two, "nvme_bytes")
        layers = min(bounds.values()) if bounds else 2
        limits[offload] = {"layers": layers, "params": model_params(args, layers),
                           "bound_by": min(bounds, key=bounds.get) if bounds else None,
                           "bounds_layers": bounds}
    return limits


# ---------------------------------------------------------------------- report
def _fmt_run(name, r):
    if "error" in r:
        return f"{name:<34} failed: {r['error']}"
    peak = r.get("peak_gpu_bytes")
    return (f"{name:<34} {r['params'] / 1e9:7.2f}B {r['samples_per_s']:9.2f} "
            f"{r['tokens_per_s']:10.0f} {r['tflops']:8.1f} "
            f"{(peak or 0) / 2**30:9.1f} {r['peak_host_bytes'] / 2**30:9.1f}   "
            + " ".join(f"{k} {v:.2f}s" for k, v in r["phases_s"].items()))


def main(argv=None):
    args = parse_args(argv)
    if args.child:
        print(json.dumps(run_child(json.loads(args.child))))
        return 0
    deadline = time.monotonic() + args.budget
    own_dir = args.nvme_dir is None
    args.nvme_dir = args.nvme_dir or tempfile.mkdtemp(prefix="ds_nvme_bench_")
    try:
        return _run(args, deadline)
    finally:
        if own_dir:
            shutil.rmtree(args.nvme_dir, ignore_errors=True)


def _run(args, deadline):
    info = machine(args)
    shared = {k: getattr(args, k) for k in ("n_embd", "head_dim", "vocab", "seq", "micro", "gas",
                                            "steps", "warmup")}
    # probes: one micro-batch per step (the memory peak is a micro-batch's), one step timed
    probe_args = dict(shared, steps=1, warmup=1, gas=1)
    summary = {"machine": info, "model": shared, "runs": {}, "skipped": {}}

    def run(name, layers, offload, probe=False, steps=None):
        left = deadline - time.monotonic()
        if left < 5:
            summary["skipped"][name] = f"budget spent ({args.budget:.0f} s)"
            return {"layers": layers, "offload": offload, "error": "skipped: budget spent"}
        nvme = os.path.join(args.nvme_dir, name)
        if offload == "nvme":
            os.makedirs(nvme, exist_ok=True)
        spec = {"layers": layers, "offload": offload, "nvme_dir": nvme,
                "args": probe_args if probe else dict(shared, steps=steps or shared["steps"])}
        result = measure(spec, left, in_process=args.dry_run)
        if offload == "nvme":
            shutil.rmtree(nvme, ignore_errors=True)
        summary["runs"][name] = result
        return result

    def probe(run, offload):
        """The two probe depths, each in its own process: in one process the second model's
        GPU peak included what the first left cached (an H200 run read a one-layer model as
        5 GiB larger than a two-layer one, and planned for 10^11 layers)."""
        return [run(f"probe_{offload}_{layers}", layers, offload, True) for layers in (2, 1)]

    offloads = ("none", "cpu", "nvme") if args.nvme or not args.dry_run else ("none", "cpu")
    if "nvme" not in offloads:
        summary["skipped"]["nvme"] = "dry run: the NVMe runs build the async_io op (--nvme)"
    probes = {offload: probe(run, offload) for offload in offloads[:2]}
    limits = summary["limits"] = plan(args, info, probes)
    gpu_only = limits["none"].get("layers")
    cpu_max = limits["cpu"].get("layers")
    if gpu_only is None or cpu_max is None:
        print("sizing failed: " + json.dumps(limits))
    else:
        common = max(min(gpu_only, cpu_max), 1)
        # both timed runs must end inside the budget: the probes' seconds per layer say how
        # deep that allows (the deepest common model otherwise takes minutes per step)
        affordable = affordable_layers(args, probes, deadline - time.monotonic())
        if affordable is not None and affordable < common:
            summary["skipped"]["deepest_common"] = (
                f"{common} layers fit both ways, but the time left allows {affordable}: the "
                f"ratio is measured at {affordable}")
            common = affordable
        summary["common_layers"] = common
        if args.dry_run:
            common = 2
        base = run("all_on_gpu", common, "none")
        off = run("cpu_offload", common, "cpu")
        if "error" not in base and "error" not in off:
            summary["ratio_offload_to_gpu"] = off["samples_per_s"] / base["samples_per_s"]
        beyond = max(gpu_only + 1, math.ceil(gpu_only * 1.2))
        if args.dry_run:
            beyond = 3
        if beyond <= cpu_max or args.dry_run:
            run("cpu_offload_beyond_gpu", beyond, "cpu", steps=1)
            # fp32 master weights and both Adam moments: what would have to sit on the GPU
            summary["beyond_gpu_fp32_adam_state_bytes"] = 12 * model_params(args, beyond)
        else:
            summary["skipped"]["cpu_offload_beyond_gpu"] = (
                f"host RAM bounds CPU offload to {cpu_max} layers, not deeper than the "
                f"{gpu_only} that fit all on the GPU")
        if "nvme" in offloads:  # last: the least valuable figure if the budget runs out
            probes["nvme"] = probe(run, "nvme")
            nvme = plan(args, info, {"nvme": probes["nvme"]})["nvme"]
            limits["nvme"] = summary["limits"]["nvme"] = nvme
        if args.verify_largest:
            run("cpu_offload_largest", cpu_max, "cpu", steps=1)
    report(args, summary)
    record(args, summary)
    return 0


def record(args, summary):
    """The figures record (bench_figures.emit): every run's figures, the limits, the ratio."""
    sys.path.insert(0, str(HERE))
    from bench_figures import emit, target

    figures = {"machine": summary["machine"], "model": summary["model"],
               "limits": summary.get("limits"), "skipped": summary["skipped"],
               "beyond_gpu_fp32_adam_state_bytes": summary.get("beyond_gpu_fp32_adam_state_bytes")}
    for name, r in summary["runs"].items():
        figures[name] = r
    targets = {}
    if "ratio_offload_to_gpu" in summary:
        figures["ratio_offload_to_gpu"] = summary["ratio_offload_to_gpu"]
        targets["zero_offload_vs_all_on_gpu"] = target(summary["ratio_offload_to_gpu"], ">=", 0.7)
    emit(args.json, "zero_offload", figures, targets, dry_run=args.dry_run)


def report(args, summary):
    info = summary["machine"]
    print(f"# {info.get('gpu') or 'no GPU'}, torch {info.get('torch')}, CUDA {info.get('cuda')}; "
          f"GPU free {info.get('gpu_free', 0) / 2**30:.1f} GiB, host available "
          f"{info['host_available'] / 2**30:.1f} GiB, disk free {info['disk_free'] / 2**30:.1f} "
          f"GiB; GPT width {args.n_embd}, seq {args.seq}, {args.micro} x {args.gas} "
          f"micro-batches per step, {'fp32 (dry run)' if args.dry_run else 'bf16'}")
    print(f"{'run':<34} {'params':>8} {'samples/s':>9} {'tokens/s':>10} {'TFLOPS':>8} "
          f"{'GPU GiB':>9} {'host GiB':>9}   time per step")
    for name, r in summary["runs"].items():
        for one in (r if isinstance(r, list) else [r]):
            print(_fmt_run(f"{name} ({one.get('layers')} layers)" if isinstance(r, list)
                           else name, one))
    for offload, limit in summary.get("limits", {}).items():
        what = {"none": "all on the GPU", "cpu": "CPU offload", "nvme": "NVMe offload"}[offload]
        if "error" in limit:
            print(f"largest trainable, {what}: unknown ({limit['error']})")
        else:
            print(f"largest trainable, {what}: {limit['params'] / 1e9:.2f}B parameters "
                  f"({limit['layers']} layers; bound by {limit['bound_by']}; computed from the "
                  f"probes, per bound: {limit['bounds_layers']} layers)")
    if "beyond_gpu_fp32_adam_state_bytes" in summary:
        print(f"cpu_offload_beyond_gpu: fp32 master weights + Adam moments "
              f"{summary['beyond_gpu_fp32_adam_state_bytes'] / 2**30:.1f} GiB against "
              f"{info.get('gpu_total', 0) / 2**30:.1f} GiB of GPU memory")
    if "ratio_offload_to_gpu" in summary:
        print(f"CPU offload / all on the GPU at the deepest common model: "
              f"{summary['ratio_offload_to_gpu']:.2f}x samples/s (target >= 0.7)")
    for name, why in summary["skipped"].items():
        print(f"skipped {name}: {why}")


if __name__ == "__main__":
    sys.exit(main())
