"""Turning recorded comm calls into the documented summary table (and its dict form).

Rows are grouped by op name, then by message size; the columns are Count, Total Latency(ms),
Avg Latency(ms), tput_avg (Gbps) = mean algorithmic bandwidth and busbw_avg (Gbps) = mean bus
bandwidth, plus the straggler columns when asked for. The dict form also says, per row, which
process groups the calls ran in (``groups``: global ranks -> calls), so a test can check that a
collective stayed inside a "node".
"""
from collections import Counter
from dataclasses import dataclass, field
from typing import Dict, List

from deepspeed.utils.plots import BarPanel, bar_figure, write_png

_UNITS = ("B", "KB", "MB", "GB", "TB", "PB")


def format_size(size_bytes: int) -> str:
    """Binary units, two decimals at most, as in the tutorial's samples ("2.0 KB", "678.86 MB")."""
    if size_bytes < 0:
        raise ValueError(f"a message size cannot be negative, got {size_bytes}")
    value, unit = float(size_bytes), 0
    while value >= 1024 and unit < len(_UNITS) - 1:
        value /= 1024
        unit += 1
    if unit == 0:
        return f"{int(size_bytes)} B"
    return f"{round(value, 2)} {_UNITS[unit]}"


@dataclass
class OpStats:
    """Every logged call of one op name at one message size, in call order (the straggler
    computation pairs the i-th call of each rank)."""

    latencies_ms: List[float] = field(default_factory=list)
    algbws: List[float] = field(default_factory=list)
    busbws: List[float] = field(default_factory=list)
    groups: Counter = field(default_factory=Counter)  # group's global ranks -> calls in it

    def add(self, latency_ms: float, algbw: float, busbw: float, group_ranks=None) -> None:
        self.latencies_ms.append(latency_ms)
        self.algbws.append(algbw)
        self.busbws.append(busbw)
        if group_ranks is not None:
            self.groups[tuple(group_ranks)] += 1

    def row(self) -> Dict[str, float]:
        count = len(self.latencies_ms)
        total = sum(self.latencies_ms)
        return {"count": count, "total_latency_ms": total, "avg_latency_ms": total / count,
                "tput_avg_gbps": sum(self.algbws) / count,
                "busbw_avg_gbps": sum(self.busbws) / count, "groups": dict(self.groups)}


BASE_COLUMNS = (("Count", "count", "{:d}"), ("Total Latency(ms)", "total_latency_ms", "{:.2f}"),
                ("Avg Latency(ms)", "avg_latency_ms", "{:.2f}"),
                ("tput_avg (Gbps)", "tput_avg_gbps", "{:.2f}"),
                ("busbw_avg (Gbps)", "busbw_avg_gbps", "{:.2f}"))
STRAGGLER_COLUMNS = (("Total Straggler(ms)", "total_straggler_ms", "{:.2f}"),
                     ("Avg Straggler(ms)", "avg_straggler_ms", "{:.2f}"),
                     ("Min Latency(ms)", "min_latency_ms", "{:.2f}"),
                     ("Max Latency(ms)", "max_latency_ms", "{:.2f}"))


def _cell(fmt, value):
    return "n/a" if value is None else fmt.format(value)


def render_table(summary: Dict[str, Dict[int, Dict[str, float]]], show_straggler: bool) -> str:
    """The summary as text: a header, then each op name on its own line followed by one
    indented row per message size (smallest first)."""
    columns = BASE_COLUMNS + (STRAGGLER_COLUMNS if show_straggler else ())
    header = ["Comm. Op", "Message Size"] + [title for title, _, _ in columns]
    rows = []
    for name in sorted(summary):
        rows.append([name] + [""] * (len(header) - 1))
        for size in sorted(summary[name]):
            row = summary[name][size]
            rows.append(["", format_size(size)] + [_cell(fmt, row.get(key))
                                                   for _, key, fmt in columns])
    widths = [max([len(header[i])] + [len(r[i]) for r in rows if i or r[1]])
              for i in range(len(header))]
    widths[0] = max(len(header[0]), 2)

    def line(cells):
        return "  ".join(cell.ljust(widths[i]) for i, cell in enumerate(cells)).rstrip()

    out = [line(header)]
    for row in rows:
        out.append(row[0] if row[0] else line(row))
    return "\n".join(out)


def summary_figure(summary: Dict[str, Dict[int, Dict[str, float]]]):
    """Two bar charts over the op names: the bytes each op moved (message size x calls, summed
    over sizes) and its total latency."""
    names = sorted(summary)
    moved = [sum(size * row["count"] for size, row in summary[name].items()) / 2**20
             for name in names]
    latency = [sum(row["total_latency_ms"] for row in summary[name].values()) for name in names]
    return bar_figure([BarPanel(names, moved, "MiB moved (all calls)", title="bytes per op"),
                       BarPanel(names, latency, "total latency (ms)", title="latency per op")],
                      title="communication summary")


def plot_summary(summary: Dict[str, Dict[int, Dict[str, float]]], path):
    """Write ``summary`` (``deepspeed.comm.log_summary(return_dict=True)``) as a PNG at ``path``:
    bytes and latency per op. Needs matplotlib (the ``plots`` extra); returns the figure."""
    figure = summary_figure(summary)
    write_png(figure, path)
    return figure
