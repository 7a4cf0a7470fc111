"""PNG bar charts for the reports people would rather look at than read: autotuning results,
the comms-logger summary, the flops profile by module.

matplotlib is optional (the ``plots`` extra): asked for explicitly, a plot without it is an
``ImportError`` that names the extra; written automatically next to a text report, the report
says once how to get it. Figures are built with matplotlib's object API (``Figure`` on the Agg
canvas), never through ``pyplot``, so writing a plot changes no global backend or state of the
user's matplotlib. The figure is returned so callers (and tests) can look at what was drawn.
"""
import os
from dataclasses import dataclass
from typing import List, Optional, Sequence

from deepspeed.utils.logging import logger

PLOTS_EXTRA = "plots"
INSTALL_HINT = f"pip install 'deepspeed[{PLOTS_EXTRA}]' (or pip install matplotlib)"


class PlotsUnavailableError(ImportError):
    """matplotlib is not installed; the message says how to install it."""


def plots_available() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def _figure_class():
    try:
        from matplotlib.figure import Figure
    except ImportError as exc:
        raise PlotsUnavailableError(f"writing PNG plots needs matplotlib, which is not "
                                    f"installed: {INSTALL_HINT}") from exc
    return Figure


@dataclass
class BarPanel:
    """One chart of a figure: a horizontal bar per label (long names stay readable)."""
    labels: Sequence[str]
    values: Sequence[float]
    xlabel: str
    title: str = ""
    marked: Optional[int] = None  # index of the bar to mark (e.g. the chosen experiment)
    marked_label: str = "chosen"


def bar_figure(panels: List[BarPanel], title: str = ""):
    """A matplotlib ``Figure`` with one horizontal bar chart per panel, side by side."""
    Figure = _figure_class()
    rows = max(len(p.labels) for p in panels) if panels else 1
    figure = Figure(figsize=(6.0 * max(1, len(panels)), 1.2 + 0.35 * max(rows, 2)),
                    layout="constrained")
    axes = figure.subplots(1, max(1, len(panels)), squeeze=False)[0]
    for ax, panel in zip(axes, panels):
        positions = list(range(len(panel.labels)))
        colors = ["tab:orange" if i == panel.marked else "tab:blue" for i in positions]
        ax.barh(positions, list(panel.values), color=colors)
        ax.set_yticks(positions, [str(label) for label in panel.labels])
        ax.invert_yaxis()  # first label on top, as in the text report
        ax.set_xlabel(panel.xlabel)
        if panel.title:
            ax.set_title(panel.title)
        if panel.marked is not None:
            ax.scatter([panel.values[panel.marked]], [panel.marked], marker="*", s=160,
                       color="tab:red", zorder=3, label=panel.marked_label)
            ax.legend(loc="best")
    if title:
        figure.suptitle(title)
    return figure


def write_png(figure, path) -> str:
    """Save ``figure`` as a PNG at ``path`` all-or-nothing (temporary name, then rename)."""
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    tmp = os.path.join(directory, f".{os.path.basename(path)}.tmp-{os.getpid()}")
    try:
        figure.savefig(tmp, format="png", dpi=100)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path


_hinted = set()


def write_png_beside(report_path, make_figure, suffix=".png") -> Optional[str]:
    """The automatic plot next to a text report: ``<report without extension><suffix>``, or,
    without matplotlib, one log line per report kind saying how to get it. Returns the path
    written, or None."""
    if not plots_available():
        kind = os.path.basename(os.fspath(report_path))
        if kind not in _hinted:
            _hinted.add(kind)
            logger.info(f"no plot next to {report_path}: matplotlib is not installed; "
                        f"{INSTALL_HINT}")
        return None
    stem = os.path.splitext(os.fspath(report_path))[0]
    return write_png(make_figure(), stem + suffix)
