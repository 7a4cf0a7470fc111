"""The summary the autotuner prints and writes: one row per tuning space (ZeRO stage) with its
number of experiments, best metric and best experiment, and a ``global`` row."""
import json
import os
from typing import Dict, List

from deepspeed.utils.plots import BarPanel, bar_figure, write_png_beside

HIGHER_IS_BETTER = {"throughput": True, "FLOPS": True, "latency": False}
UNITS = {"throughput": "samples/s", "latency": "ms/step", "FLOPS": "FLOP/s"}


def score(metric: str, metrics: dict) -> float:
    value = float(metrics[metric])
    return value if HIGHER_IS_BETTER[metric] else -value


def summarize(metric: str, experiments: List[dict]) -> Dict[str, dict]:
    """``{"z0": {...}, ..., "global": {...}}`` from the experiment records."""
    rows = {}
    for record in experiments:
        for space in (f"z{record['stage']}", "global"):
            row = rows.setdefault(space, {"num_experiments": 0, "best_metric_val": None,
                                          "best_exp_name": None})
            row["num_experiments"] += 1
            value = record.get("metric_value")
            if value is None:
                continue
            better = row["best_metric_val"] is None or (
                value > row["best_metric_val"] if HIGHER_IS_BETTER[metric]
                else value < row["best_metric_val"])
            if better:
                row["best_metric_val"], row["best_exp_name"] = value, record["name"]
    ordered = {k: rows[k] for k in sorted(k for k in rows if k != "global")}
    if "global" in rows:
        ordered["global"] = rows["global"]
    return ordered


def table(metric: str, rows: Dict[str, dict]) -> str:
    header = ("tuning_space", "num_experiments", f"best_metric_val ({metric}, {UNITS[metric]})",
              "best_exp_name")
    body = [(space, str(r["num_experiments"]),
             "-" if r["best_metric_val"] is None else f"{r['best_metric_val']:.4g}",
             r["best_exp_name"] or "(all failed)") for space, r in rows.items()]
    widths = [max(len(row[i]) for row in [header] + body) for i in range(4)]
    line = lambda cells: "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths)) + " |"  # noqa: E731
    rule = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    return "\n".join([line(header), rule] + [line(row) for row in body])


def experiments_figure(metric: str, experiments: List[dict], best: dict):
    """One bar per measured experiment (in the order they ran) with its metric, the chosen one
    marked; failed experiments have no value and no bar."""
    measured = [r for r in experiments if r.get("metric_value") is not None]
    names = [r["name"] for r in measured]
    return bar_figure([BarPanel(labels=names, values=[r["metric_value"] for r in measured],
                                xlabel=f"{metric} ({UNITS[metric]})",
                                marked=names.index(best["name"]) if best["name"] in names
                                else None,
                                marked_label=f"chosen: {best['name']}")],
                      title=f"autotuning: {metric} per experiment "
                            f"({len(measured)} of {len(experiments)} measured)")


def write_summary(results_dir: str, metric: str, experiments: List[dict], pruned: List[dict],
                  best: dict, elapsed_s: float) -> str:
    """``summary.txt`` (the table returned), ``summary.json`` and, with matplotlib,
    ``summary.png`` (the metric per experiment, the chosen one marked)."""
    rows = summarize(metric, experiments)
    text = table(metric, rows)
    summary_path = os.path.join(results_dir, "summary.txt")
    with open(summary_path, "w", encoding="utf-8") as handle:
        handle.write(text + "\n")
    write_png_beside(summary_path, lambda: experiments_figure(metric, experiments, best))
    with open(os.path.join(results_dir, "summary.json"), "w", encoding="utf-8") as handle:
        json.dump({"metric": metric, "tuning_spaces": rows, "experiments": experiments,
                   "pruned": pruned, "best": best, "tuning_time_s": elapsed_s}, handle, indent=2)
    return text
