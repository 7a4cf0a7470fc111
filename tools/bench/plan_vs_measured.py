"""Predicted (``deepspeed.plan``) vs measured (comms logger, profiler) for the planner's
validation set on two gloo ranks: prints the markdown table kept in docs/dev/benchmarks.md.

    python tools/bench/plan_vs_measured.py
"""
from deepspeed.plan.measure import (MEMORY_CASES, VALIDATION_CASES, measure_validation_set,
                                    pipeline_plan, tensor_parallel_plan, validation_plan)
from deepspeed.testing.distributed import run_distributed


def main():
    ranks = run_distributed(measure_validation_set, world_size=2)
    print("| case | collective | planned {bytes: calls} per step | logged (rank 0; rank 1) "
          "| planned peak | measured peak (rank 0, rank 1) | error |")
    print("|---|---|---|---|---|---|---|")
    for name, zero in VALIDATION_CASES.items():
        planned, plan = validation_plan(zero)
        for i, op in enumerate(sorted(set(planned) | set(ranks[0][name][0]))):
            logged = "; ".join(str(r[name][0].get(op, {})) for r in ranks)
            memory = ["", "", ""]
            if i == 0 and name in MEMORY_CASES:
                peaks = [r[name][1] for r in ranks]
                error = max(abs(plan.peak - p) / p for p in peaks)
                memory = [f"{plan.peak:,}", ", ".join(f"{p:,.0f}" for p in peaks), f"{error:.1%}"]
            elif i == 0 and zero["stage"] == 3:
                memory = ["", "not measurable (ZeRO-3 frees in place)", ""]
            print(f"| {name if i == 0 else ''} | `{op}` | {planned.get(op, {})} | {logged} | "
                  + " | ".join(memory) + " |")
    for case, title, plan in (("pipeline pp2", "pipeline pp2 (ga 3)", pipeline_plan),
                              ("tensor tp2", "tensor tp2 (tiny Llama)", tensor_parallel_plan)):
        planned = plan()
        for i, op in enumerate(sorted(set(planned) | set(ranks[0][case][0]))):
            logged = "; ".join(str(r[case][0].get(op, {})) for r in ranks)
            print(f"| {title if i == 0 else ''} | `{op}` | {planned.get(op, {})} | {logged} | "
                  f"| not measured | |")


if __name__ == "__main__":
    main()
