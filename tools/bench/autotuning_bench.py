"""Autotuning on the demo GPT with 2 CPU ranks: how long the search takes, how far apart its
best and worst experiments are, and whether its pick beats hand-written configs.

    python tools/bench/autotuning_bench.py [--ranks 2] [--workdir /tmp/autotuning_bench]

Runs ``deepspeed --autotuning tune --num_gpus 2 examples/train_demo.py --deepspeed_config
cfg.json`` with the example config ``examples/autotuning/ds_config.json`` (every tunable value "auto":
ZeRO stages 0-3 x the micro-batch sizes the profile allows up to 256, the docs' default
model_based tuner), then measures, in the same way and in the
same run, the chosen config again and the hand-written configs "stage k, micro-batch 4" for
k = 0..3. Prints the figures and the ratios (throughput, samples/s: higher is better).

    python tools/bench/autotuning_bench.py --compare-plan-pruning

runs the same search twice, without and with ``autotuning.plan_pruning``, and then measures
the two picks again, alternating, three times each: experiments run and the picks'
throughput (docs/dev/benchmarks.md, planner section).
"""
import argparse
import json
import os
import statistics
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


def tune(workdir, ranks, config):
    """One ``deepspeed --autotuning tune`` run in ``workdir``: (summary.json, seconds, argv)."""
    os.makedirs(workdir, exist_ok=True)
    with open(os.path.join(workdir, "cfg.json"), "w", encoding="utf-8") as handle:
        json.dump(config, handle)
    argv = ["--autotuning", "tune", "--num_gpus", str(ranks), DEMO,
            "--deepspeed_config", "cfg.json"]
    start = time.perf_counter()
    out = subprocess.run([sys.executable, "-m", "deepspeed.launcher.runner"] + argv,
                         cwd=workdir, check=False)
    tuning_s = time.perf_counter() - start
    if out.returncode:
        raise SystemExit(f"autotuning failed with exit code {out.returncode}")
    with open(os.path.join(workdir, "autotuning_results", "summary.json"),
              encoding="utf-8") as handle:
        return json.load(handle), tuning_s, argv


def remeasurer(workdir, config, argv):
    """An ``Autotuner`` whose ``evaluate(point)`` runs one experiment again (its own results
    directory, overwriting), for measuring picks side by side."""
    from deepspeed.autotuning.autotuner import Autotuner
    from deepspeed.launcher.runner import parse_args

    os.chdir(workdir)
    with open("cfg.json", "w", encoding="utf-8") as handle:
        json.dump(dict(config, autotuning=dict(config["autotuning"], results_dir="bench_remeasure",
                                               exps_dir="bench_remeasure_exps")), handle)
    tuner = Autotuner(parse_args(argv), argv)
    tuner.oom = set()
    return tuner


def point_of(record):
    from deepspeed.autotuning.space import Point

    return Point(record["stage"], record["micro_batch"], record["gas"],
                 tuple(sorted(record["knobs"].items())))


def best_of(summary):
    measured = [r for r in summary["experiments"] if r["metric_value"] is not None]
    return max(measured, key=lambda r: r["metric_value"]), min(measured, key=lambda r: r["metric_value"])


def compare_plan_pruning(args):
    """The search without and with plan pruning, then both picks measured again."""
    found = {}
    for name, pruning in (("without plan", False), ("with plan", True)):
        config = dict(CONFIG, autotuning=dict(CONFIG["autotuning"], plan_pruning=pruning))
        workdir = os.path.join(args.workdir, "plan" if pruning else "no_plan")
        summary, seconds, argv = tune(workdir, args.ranks, config)
        found[name] = (summary, seconds, best_of(summary)[0])
    tuner = remeasurer(os.path.join(args.workdir, "no_plan"), CONFIG, argv)
    again = {name: [] for name in found}
    for _ in range(3):
        for name, (_, _, best) in found.items():
            again[name].append(tuner.evaluate(point_of(best)))
    print("\n== autotuning with and without plan pruning (demo GPT, %d CPU ranks) ==" % args.ranks)
    for name, (summary, seconds, best) in found.items():
        values = [v for v in again[name] if v is not None]
        print(f"{name:13}: {len(summary['experiments'])} experiments + 1 profiling run, "
              f"{seconds:.0f} s; pick {best['name']} {best['metric_value']:.1f} samples/s; "
              f"measured again {', '.join(f'{v:.1f}' for v in values)} "
              f"(median {statistics.median(values):.1f})")
    ratio = statistics.median(again["with plan"]) / statistics.median(again["without plan"])
    print(f"pick with plan / pick without, median of 3 alternating runs: {ratio:.2f}x")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--workdir", default="/tmp/autotuning_bench")
    parser.add_argument("--compare-plan-pruning", action="store_true",
                        help="the search without and with autotuning.plan_pruning")
    args = parser.parse_args()
    if args.compare_plan_pruning:
        return compare_plan_pruning(args)
    summary, tuning_s, argv = tune(args.workdir, args.ranks, CONFIG)
    best, worst = best_of(summary)

    # re-measure the pick and the hand-written configs with the autotuner's own experiment runs
    from deepspeed.autotuning.space import Point

    tuner = remeasurer(args.workdir, CONFIG, argv)
    again = tuner.evaluate(point_of(best))
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
