"""Predicted (``deepspeed.plan``) vs measured (comms logger, profiler) for the planner's
validation set on two gloo ranks: prints the markdown table kept in docs/dev/benchmarks.md.

    python tools/bench/plan_vs_measured.py
"""
import statistics
import sys
from pathlib import Path

# the model-parallel scenarios and the one-job measurement live with the planner's tests
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests" / "plugins" / "plan"))

from test_plan_vs_measured import SCENARIOS, measure_all  # noqa: E402

from deepspeed.plan.measure import MEMORY_CASES, VALIDATION_CASES, validation_plan  # noqa: E402
from deepspeed.testing.distributed import run_distributed  # noqa: E402

RUNS = 5
TITLES = {"pipeline pp2": "pipeline pp2 (ga 3)", "tensor tp2": "tensor tp2 (tiny Llama)",
          "sequence sp2": "Ulysses sp2 (tiny Llama, stage 0)",
          "expert ep2": "expert ep2 (MoE, 4 experts, stage 0)"}


def rows(title, planned, plan, ranks, case):
    """The table's rows of one case: one per collective, the memory columns on the first."""
    peaks = sorted(p for r in ranks for p in r[case][1])
    median = statistics.median(peaks)
    memory = [f"{plan.unified_peak:,}",
              f"median {median:,.0f} (min {peaks[0]:,}, max {peaks[-1]:,})",
              f"{(plan.unified_peak - median) / median:+.1%}"]
    for i, op in enumerate(sorted(set(planned) | set(ranks[0][case][0]))):
        logged = "; ".join(str(r[case][0].get(op, {})) for r in ranks)
        print(f"| {title if i == 0 else ''} | `{op}` | {planned.get(op, {})} | {logged} | "
              + " | ".join(memory if i == 0 else ["", "", ""]) + " |")


def main():
    ranks = run_distributed(measure_all, args=(RUNS, RUNS), world_size=2, timeout=1800)
    print("| case | collective | planned {bytes: calls} per step | logged (rank 0; rank 1) "
          f"| planned peak | measured peak, {RUNS} runs x 2 ranks | planned vs median |")
    print("|---|---|---|---|---|---|---|")
    for name, zero in VALIDATION_CASES.items():
        planned, plan = validation_plan(zero)
        if name in MEMORY_CASES:
            rows(name, planned, plan, ranks, name)
        else:  # one run: its collectives only
            for i, op in enumerate(sorted(set(planned) | set(ranks[0][name][0]))):
                logged = "; ".join(str(r[name][0].get(op, {})) for r in ranks)
                print(f"| {name if i == 0 else ''} | `{op}` | {planned.get(op, {})} | {logged} "
                      "| | | |")
    for case, (_, plan_of) in SCENARIOS.items():
        planned, plan = plan_of()
        rows(TITLES[case], planned, plan, ranks, case)


if __name__ == "__main__":
    main()
