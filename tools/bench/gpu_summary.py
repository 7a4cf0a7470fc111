"""The summary a GPU lease brings back: one markdown table and one JSON file of every figure.

    python tools/bench/gpu_summary.py OUT_DIR

Reads what ``tools/gpu_check.sh`` leaves in OUT_DIR: ``steps.tsv`` (each step's name, exit
code, seconds, limit and status), ``env.txt`` (device, driver, torch / CUDA / nvcc versions) and
``figures.jsonl`` (one record per benchmark, see ``bench_figures.py``), and writes
``summary.md`` and ``summary.json`` beside them, printing the steps and targets tables (the
figures table is only in summary.md). It runs after every step, so a lease cut short still
leaves a current summary.
"""
import json
import sys
from pathlib import Path


def _read_steps(out):
    path = out / "steps.tsv"
    rows = []
    if path.exists():
        for line in path.read_text().splitlines():
            name, rc, seconds, limit, status = (line.split("\t") + [""] * 5)[:5]
            rows.append({"step": name, "rc": rc, "seconds": seconds, "limit": limit,
                         "status": status})
    return rows


def _read_records(out):
    path = out / "figures.jsonl"
    records = []
    if path.exists():
        for line in path.read_text().splitlines():
            if line.strip():
                try:
                    records.append(json.loads(line))
                except json.JSONDecodeError as err:  # a line cut off by a killed step
                    records.append({"bench": "unreadable", "error": str(err)})
    return records


def _fmt(value):
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def _scalars(figures, prefix=""):
    """Flat (key, value) pairs of the numbers and flags in a figures dict."""
    for key, value in figures.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            yield from _scalars(value, name + ".")
        elif isinstance(value, list) and all(isinstance(v, dict) for v in value):
            for index, item in enumerate(value):
                yield from _scalars(item, f"{name}[{index}].")
        elif isinstance(value, (int, float, bool)) or value is None:
            yield name, value
        elif isinstance(value, str) and len(value) < 200:
            yield name, value


def summarize(out):
    steps, records = _read_steps(out), _read_records(out)
    env = (out / "env.txt").read_text().strip() if (out / "env.txt").exists() else ""
    device = next((r["device"] for r in records if "device" in r), {})
    lines = ["# GPU check summary", "",
             f"device: {device.get('device', '?')}; torch {device.get('torch', '?')}, CUDA "
             f"{device.get('cuda', '?')}, Triton {device.get('triton', '?')}", ""]
    if env:
        lines += ["```", env, "```", ""]
    lines += ["| step | status | rc | seconds | limit |", "|---|---|---|---|---|"]
    lines += [f"| {s['step']} | {s['status']} | {s['rc']} | {s['seconds']} | {s['limit']} |"
              for s in steps]
    lines += ["", "| target | value | limit | met |", "|---|---|---|---|"]
    for record in records:
        dry = " (dry run)" if record.get("dry_run") else ""
        for name, t in record.get("targets", {}).items():
            met = {True: "yes", False: "NO", None: "?"}[t.get("met")]
            lines.append(f"| {name}{dry} | {_fmt(t.get('value'))} | {t.get('op')} "
                         f"{_fmt(t.get('limit'))} | {met if not dry else '-'} |")
    head = "\n".join(lines) + "\n"
    lines += ["", "| benchmark | figure | value |", "|---|---|---|"]
    for record in records:
        bench = record.get("bench", "?") + (" (dry run)" if record.get("dry_run") else "")
        for key, value in _scalars(record.get("figures", {})):
            lines.append(f"| {bench} | {key} | {_fmt(value)} |")
    text = "\n".join(lines) + "\n"
    (out / "summary.md").write_text(text)
    (out / "summary.json").write_text(json.dumps(
        {"device": device, "env": env, "steps": steps, "records": records}, indent=1,
        default=str))
    return head, text


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        sys.exit("usage: gpu_summary.py OUT_DIR")
    out = Path(argv[0])
    if not out.is_dir():
        sys.exit(f"gpu_summary.py: {out} is not a directory")
    head, _ = summarize(out)
    print(head, end="")  # the figures table is in summary.md (the lease's output tail is short)


if __name__ == "__main__":
    main()
