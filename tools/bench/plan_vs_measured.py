"""Predicted (``deepspeed.plan``) vs measured (comms logger, profiler) for the planner's
validation set on two gloo ranks: prints the markdown table kept in docs/dev/benchmarks.md.

    python tools/bench/plan_vs_measured.py
"""
import statistics
import sys
from pathlib import Path

# the model-parallel scenarios and the one-job measurement live with the planner's tests
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests" / "plugins" / "plan"))

from parallel_scenarios import (pipeline_plan, sequence_parallel_plan,  # noqa: E402
                                tensor_parallel_plan)
from test_plan_vs_measured import measure_all  # noqa: E402

from deepspeed.plan.measure import MEMORY_CASES, VALIDATION_CASES, validation_plan  # noqa: E402
from deepspeed.testing.distributed import run_distributed  # noqa: E402


def main():
    ranks = run_distributed(measure_all, args=(5,), world_size=2)
    print("| case | collective | planned {bytes: calls} per step | logged (rank 0; rank 1) "
          "| planned peak | measured peak, 5 runs x 2 ranks | error vs median |")
    print("|---|---|---|---|---|---|---|")
    for name, zero in VALIDATION_CASES.items():
        planned, plan = validation_plan(zero)
        for i, op in enumerate(sorted(set(planned) | set(ranks[0][name][0]))):
            logged = "; ".join(str(r[name][0].get(op, {})) for r in ranks)
            memory = ["", "", ""]
            if i == 0 and name in MEMORY_CASES:
                peaks = sorted(p for r in ranks for p in r[name][1])
                median = statistics.median(peaks)
                memory = [f"{plan.peak:,}", f"median {median:,.0f} (min {peaks[0]:,}, max {peaks[-1]:,})",
                          f"{abs(plan.peak - median) / median:.1%}"]
            print(f"| {name if i == 0 else ''} | `{op}` | {planned.get(op, {})} | {logged} | "
                  + " | ".join(memory) + " |")
    for case, title, plan in (("pipeline pp2", "pipeline pp2 (ga 3)", pipeline_plan),
                              ("tensor tp2", "tensor tp2 (tiny Llama)", tensor_parallel_plan),
                              ("sequence sp2", "Ulysses sp2 (tiny Llama, stage 0)",
                               sequence_parallel_plan)):
        planned = plan()
        for i, op in enumerate(sorted(set(planned) | set(ranks[0][case][0]))):
            logged = "; ".join(str(r[case][0].get(op, {})) for r in ranks)
            print(f"| {title if i == 0 else ''} | `{op}` | {planned.get(op, {})} | {logged} | "
                  f"| not measured | |")


if __name__ == "__main__":
    main()
