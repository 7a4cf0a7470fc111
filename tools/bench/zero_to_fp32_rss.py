"""Peak RSS of the offline ``zero_to_fp32.py`` script against the fp32 size of the model it
writes (the docs promise about 2x).

    python tools/bench/zero_to_fp32_rss.py                       # ~200M params, 2 gloo ranks
    python tools/bench/zero_to_fp32_rss.py --layers 4 --width 1024 --workdir /tmp --keep

Builds a ZeRO-3 checkpoint (fp32, AdamW, one training step) of a stack of wide Linear layers on
2 gloo ranks, then runs the copy of the script that the save put into the checkpoint folder
(one output file, then ``--max_shard_size`` shards into a directory) in a fresh process that
reports its own ``ru_maxrss`` (the checkpoint builders are other processes, so their peaks do not
mix in). Also measured: the same process importing only torch (the script imports nothing from
DeepSpeed), the interpreter's share of the peak. Needs disk
for the checkpoint (about 3x the model: fp32 masters and two Adam moments) plus the output.
It is a tool, never a test: nothing here asserts on memory.
"""
import argparse
import os
import shutil
import subprocess
import sys
import tempfile

import torch

# Runs ``argv[1]`` as __main__ with the remaining arguments, then prints this process's peak RSS.
_MEASURE = """
import resource, runpy, sys
script, sys.argv = sys.argv[1], sys.argv[1:]
try:
    if script != "-":
        runpy.run_path(script, run_name="__main__")
    else:
        import torch
finally:  # the script ends with sys.exit
    print("PEAK_RSS_KB", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
"""


def _model(layers, width):
    torch.manual_seed(0)
    return torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(layers)])


def _build_checkpoint(save_dir, layers, width):
    """One rank: a ZeRO-3 engine, one AdamW step, a checkpoint."""
    import deepspeed

    model = _model(layers, width)
    config = {"train_micro_batch_size_per_gpu": 2,
              "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}},
              "zero_optimization": {"stage": 3}}
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                      config=config)
    x = torch.randn(2, width)
    engine.backward(engine(x).pow(2).mean())
    engine.step()
    engine.save_checkpoint(save_dir)
    return sum(p.ds_numel if hasattr(p, "ds_numel") else p.numel()
               for p in engine.module.parameters())


def _peak_rss(*argv):
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    done = subprocess.run([sys.executable, "-c", _MEASURE, *argv], env=env,
                          capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{argv} failed:\n{done.stdout}{done.stderr}")
    line = [ln for ln in done.stdout.splitlines() if ln.startswith("PEAK_RSS_KB")][-1]
    return int(line.split()[1]) * 1024


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--width", type=int, default=4096)
    parser.add_argument("--world_size", type=int, default=2)
    parser.add_argument("--workdir", default=tempfile.gettempdir())
    parser.add_argument("--max_shard_size", default="200MB",
                        help="shard size of the second, directory-output measurement")
    parser.add_argument("--keep", action="store_true", help="keep the checkpoint and output")
    args = parser.parse_args()

    from deepspeed.testing.distributed import run_distributed

    work = tempfile.mkdtemp(prefix="zero_to_fp32_rss_", dir=args.workdir)
    try:
        save_dir = os.path.join(work, "ckpt")
        numel = run_distributed(_build_checkpoint, world_size=args.world_size, fresh=True,
                                timeout=1800, args=(save_dir, args.layers, args.width))[0]
        model_bytes = numel * 4
        baseline = _peak_rss("-")
        output = os.path.join(work, "pytorch_model.bin")
        script = os.path.join(save_dir, "zero_to_fp32.py")  # the copy the save wrote
        peak = _peak_rss(script, save_dir, output)
        written = os.path.getsize(output)
        gib = 2 ** 30
        print(f"model: {numel / 1e6:.1f}M params, fp32 {model_bytes / gib:.3f} GiB "
              f"(output file {written / gib:.3f} GiB), ZeRO-3 on {args.world_size} ranks")
        print(f"interpreter + imports peak RSS: {baseline / gib:.3f} GiB")
        print(f"zero_to_fp32.py peak RSS: {peak / gib:.3f} GiB")
        print(f"peak RSS / fp32 model size: {peak / model_bytes:.2f} "
              f"(without the interpreter's share: {(peak - baseline) / model_bytes:.2f}; "
              f"target <= 2.2)")
        os.remove(output)
        sharded = _peak_rss(script, save_dir, os.path.join(work, "hf"),
                            "--max_shard_size", args.max_shard_size)
        print(f"sharded output (--max_shard_size {args.max_shard_size}): peak RSS "
              f"{sharded / gib:.3f} GiB, {sharded / model_bytes:.2f} x the fp32 model")
    finally:
        if args.keep:
            print(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
