"""``deepspeed.utils.plots``: bar charts as valid PNGs, and a clear answer without matplotlib."""
import sys

import pytest
from png_checks import assert_png, bars, marked_points

from deepspeed.utils import plots


def test_bar_figure_draws_one_bar_per_label_and_marks_the_chosen_one(tmp_path):
    figure = plots.bar_figure([plots.BarPanel(["a", "b", "c"], [3.0, 5.0, 1.0], "x", marked=1),
                               plots.BarPanel(["a", "b", "c"], [1.0, 2.0, 3.0], "y")], title="t")
    first, second = figure.axes
    assert bars(first) == [("a", 3.0), ("b", 5.0), ("c", 1.0)] and len(bars(second)) == 3
    assert marked_points(first) == [(5.0, 1.0)] and marked_points(second) == []
    path = plots.write_png(figure, tmp_path / "sub" / "chart.png")
    assert_png(path)
    assert [p.name for p in (tmp_path / "sub").iterdir()] == ["chart.png"]  # no temporary left


@pytest.fixture
def without_matplotlib(monkeypatch):
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # what an uninstalled package looks like
    monkeypatch.setattr(plots, "_hinted", set())


def test_asking_for_a_plot_without_matplotlib_names_the_extra(without_matplotlib):
    with pytest.raises(plots.PlotsUnavailableError, match=r"pip install 'deepspeed\[plots\]'"):
        plots.bar_figure([plots.BarPanel(["a"], [1.0], "x")])


def test_the_automatic_plot_without_matplotlib_is_one_hint(without_matplotlib, tmp_path, caplog):
    from deepspeed.utils.logging import logger

    report = tmp_path / "summary.txt"
    logger.addHandler(caplog.handler)
    try:
        assert plots.write_png_beside(report, lambda: pytest.fail("no figure without it")) is None
        assert plots.write_png_beside(report, lambda: pytest.fail("no figure without it")) is None
    finally:
        logger.removeHandler(caplog.handler)
    hints = [r.getMessage() for r in caplog.records if "matplotlib" in r.getMessage()]
    assert len(hints) == 1 and "deepspeed[plots]" in hints[0] and "summary.txt" in hints[0]
    assert list(tmp_path.iterdir()) == []
