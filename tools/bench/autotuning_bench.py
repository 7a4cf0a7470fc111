"""Autotuning on the demo GPT with 2 CPU ranks: how long the search takes, how far apart its
best and worst experiments are, and whether its pick beats hand-written configs.

    python tools/bench/autotuning_bench.py [--ranks 2] [--workdir /tmp/autotuning_bench]

Runs ``deepspeed --autotuning tune --num_gpus 2 examples/train_demo.py --deepspeed_config
cfg.json`` with the example config ``examples/autotuning/ds_config.json`` (every tunable value "auto":
ZeRO stages 0-3 x the micro-batch sizes the profile allows up to 256, the docs' default
model_based tuner), then measures, in the same way and in the
same run, the chosen config again and the hand-written configs "stage k, micro-batch 4" for
k = 0..3. Prints the figures and the ratios (throughput, samples/s: higher is better).
"""
import argparse
import json
import os
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEMO = os.path.join(REPO, "examples", "train_demo.py")
# the example's config (examples/autotuning/ds_config.json): every tunable value "auto", the
# docs' model_based tuner; micro-batches capped at 256 (on CPU, memory alone would allow 1024,
# which only costs time: larger micro-batches stop paying off well before it)
with open(os.path.join(REPO, "examples", "autotuning", "ds_config.json"), encoding="utf-8") as _f:
    CONFIG = json.load(_f)
CONFIG["autotuning"]["overwrite"] = True


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--workdir", default="/tmp/autotuning_bench")
    args = parser.parse_args()
    os.makedirs(args.workdir, exist_ok=True)
    with open(os.path.join(args.workdir, "cfg.json"), "w", encoding="utf-8") as handle:
        json.dump(CONFIG, handle)
    argv = ["--autotuning", "tune", "--num_gpus", str(args.ranks), DEMO,
            "--deepspeed_config", "cfg.json"]
    start = time.perf_counter()
    out = subprocess.run([sys.executable, "-m", "deepspeed.launcher.runner"] + argv,
                         cwd=args.workdir, check=False)
    tuning_s = time.perf_counter() - start
    if out.returncode:
        raise SystemExit(f"autotuning failed with exit code {out.returncode}")
    with open(os.path.join(args.workdir, "autotuning_results", "summary.json"),
              encoding="utf-8") as handle:
        summary = json.load(handle)
    measured = [r for r in summary["experiments"] if r["metric_value"] is not None]
    best = max(measured, key=lambda r: r["metric_value"])
    worst = min(measured, key=lambda r: r["metric_value"])

    # re-measure the pick and the hand-written configs with the autotuner's own experiment runs
    os.chdir(args.workdir)
    from deepspeed.autotuning.autotuner import Autotuner
    from deepspeed.autotuning.space import Point
    from deepspeed.launcher.runner import parse_args

    with open("cfg.json", "w", encoding="utf-8") as handle:
        json.dump(dict(CONFIG, autotuning=dict(CONFIG["autotuning"], results_dir="bench_remeasure",
                                               exps_dir="bench_remeasure_exps")), handle)
    tuner = Autotuner(parse_args(argv), argv)
    tuner.oom = set()
    again = tuner.evaluate(Point(best["stage"], best["micro_batch"], best["gas"],
                                 tuple(sorted(best["knobs"].items()))))
    hand = {stage: tuner.evaluate(Point(stage, 4, 1)) for stage in range(4)}

    print("\n== autotuning benchmark (demo GPT, %d CPU ranks) ==" % args.ranks)
    print(f"tuning time            : {tuning_s:.0f} s ({len(summary['experiments'])} experiments "
          f"+ 1 profiling run)")
    print(f"best experiment        : {best['name']} {best['metric_value']:.1f} samples/s")
    print(f"worst experiment       : {worst['name']} {worst['metric_value']:.1f} samples/s")
    print(f"best / worst           : {best['metric_value'] / worst['metric_value']:.2f}x")
    print(f"best, measured again   : {again:.1f} samples/s")
    for stage, value in hand.items():
        text = "failed" if value is None else f"{value:.1f} samples/s, pick/this = {again / value:.2f}x"
        print(f"hand-written z{stage} mbs 4  : {text}")


if __name__ == "__main__":
    main()
