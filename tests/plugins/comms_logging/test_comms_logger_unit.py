"""CommsLogger on synthetic records (one process): filtering, bandwidth columns, verbose lines,
the table and the config section."""
import logging
import re

import pytest

from deepspeed.comm import observers
from deepspeed.comms_logging import CommsLogger, CommsLoggerConfig, format_size, render_table
from deepspeed.utils.logging import logger as ds_logger

GBPS = 8 / 1e9
VERBOSE_LINE = re.compile(r"rank=(\d+) \| comm op: (.+) \| time \(ms\): ([\d.]+) \| msg size: "
                          r"(.+) \| algbw \(Gbps\): ([\d.]+) \| busbw \(Gbps\): ([\d.]+)$")


def record(op, size, seconds, n=2, prof=False, caller="train_step", log_name=None):
    algbw, busbw = observers.bandwidth(op, size, seconds, n)
    return observers.CommRecord(op=op, log_name=log_name or op, size_bytes=size,
                                latency_s=seconds, group_size=n, rank=0, algbw_gbps=algbw,
                                busbw_gbps=busbw, prof=prof, caller=caller)


def enabled(**settings):
    return CommsLogger(CommsLoggerConfig(enabled=True, **settings))


@pytest.fixture
def captured():
    """The deepspeed logger does not propagate to root, so listen on it directly."""
    lines = []
    handler = logging.Handler(level=logging.INFO)
    handler.emit = lambda rec: lines.append(rec.getMessage())
    previous = ds_logger.level
    ds_logger.addHandler(handler)
    ds_logger.setLevel(logging.INFO)
    yield lines
    ds_logger.removeHandler(handler)
    ds_logger.setLevel(previous)


def test_config_defaults_are_the_documented_ones():
    config = CommsLoggerConfig()
    assert (config.enabled, config.verbose, config.prof_all, config.debug, config.prof_ops) == \
        (False, False, True, False, [])
    with pytest.raises(ValueError, match="prof_al"):
        CommsLoggerConfig(prof_al=True)


@pytest.mark.parametrize("size, text", [(0, "0 B"), (512, "512 B"), (1024, "1.0 KB"),
                                        (2048, "2.0 KB"), (int(678.86 * 2**20), "678.86 MB"),
                                        (6 * 2**20, "6.0 MB"), (3 * 2**30, "3.0 GB")])
def test_message_sizes_are_human_readable(size, text):
    assert format_size(size) == text


@pytest.mark.parametrize("op, size, seconds", [("all_reduce", 4096, 0.002),
                                               ("all_gather_into_tensor", 1000, 0.004),
                                               ("reduce_scatter_tensor", 2**20, 0.01),
                                               ("all_to_all_single", 3000, 0.003),
                                               ("broadcast", 800, 0.001)])
def test_summary_columns_follow_the_formulas(op, size, seconds):
    n = 2
    algbw = {"all_reduce": 2 * size / seconds, "all_gather_into_tensor": size * n / seconds,
             "reduce_scatter_tensor": size * n / seconds}.get(op, size / seconds) * GBPS
    factor = {"all_reduce": 2 * (n - 1) / n / 2, "broadcast": 1.0}.get(op, (n - 1) / n)
    log = enabled()
    log(record(op, size, seconds, n))
    log(record(op, size, 3 * seconds, n))
    row = log.summary()[op][size]
    assert row["count"] == 2
    assert row["total_latency_ms"] == pytest.approx(4 * seconds * 1e3)
    assert row["avg_latency_ms"] == pytest.approx(2 * seconds * 1e3)
    assert row["tput_avg_gbps"] == pytest.approx((algbw + algbw / 3) / 2)
    assert row["busbw_avg_gbps"] == pytest.approx((algbw + algbw / 3) / 2 * factor)


def test_rows_group_by_op_then_size_and_print_on_rank_zero(capsys):
    log = enabled()
    for size in (1024, 2**20, 1024):
        log(record("all_reduce", size, 0.001))
    log(record("all_gather_into_tensor", 64, 0.001))
    answer = log.log_summary(return_dict=True)
    assert {op: {s: r["count"] for s, r in rows.items()} for op, rows in answer.items()} == \
        {"all_reduce": {1024: 2, 2**20: 1}, "all_gather_into_tensor": {64: 1}}
    out = capsys.readouterr().out.splitlines()
    assert out[0].split() == ["Comm.", "Op", "Message", "Size", "Count", "Total", "Latency(ms)",
                              "Avg", "Latency(ms)", "tput_avg", "(Gbps)", "busbw_avg", "(Gbps)"]
    assert len(out) == 6
    assert out[3] == "all_reduce" and out[1] == "all_gather_into_tensor"
    assert out[4].split()[:3] == ["1.0", "KB", "2"] and out[5].split()[:3] == ["1.0", "MB", "1"]
    assert log.log_summary() is None  # printed only, as by default


def test_prof_ops_selects_ops_and_prof_true_forces_one():
    log = enabled(prof_all=False, prof_ops=["all_gather_into_tensor", "my_reduce"])
    log(record("all_reduce", 8, 0.001))
    log(record("all_gather_into_tensor", 8, 0.001))
    log(record("all_reduce", 16, 0.001, log_name="my_reduce"))  # listed by its log name
    log(record("broadcast", 4, 0.001, prof=True))
    assert sorted(log.summary()) == ["all_gather_into_tensor", "broadcast", "my_reduce"]


def test_disabled_logger_records_nothing_and_one_record_counts_once():
    off = CommsLogger(CommsLoggerConfig(enabled=False))
    off(record("all_reduce", 8, 0.001))
    assert off.summary() == {}
    log = enabled()
    rec = record("all_reduce", 8, 0.001)
    log(rec)
    log.append(rec)  # the same record delivered by a second path (hook and observer)
    log(record("all_reduce", 8, 0.001))
    assert log.summary()["all_reduce"][8]["count"] == 2
    log.reset()
    assert log.summary() == {}


def test_verbose_prints_the_documented_line(captured):
    log = enabled(verbose=True)
    log(record("all_reduce", 2048, 0.004))
    log(record("reduce_scatter_tensor", 6 * 2**20, 0.01))
    matches = [VERBOSE_LINE.search(line) for line in captured]
    assert len(matches) == 2 and all(matches)
    rank, name, ms, size, algbw, busbw = matches[0].groups()
    assert (rank, name, float(ms), size) == ("0", "all_reduce", 4.0, "2.0 KB")
    assert float(algbw) == pytest.approx(2 * 2048 / 0.004 * GBPS, abs=0.005)
    assert float(busbw) == pytest.approx(2048 / 0.004 * GBPS, abs=0.005)  # 2(n-1)/n = 1 at n=2
    assert matches[1].group(4) == "6.0 MB"
    quiet = enabled()
    quiet(record("all_reduce", 8, 0.001))
    assert len(captured) == 2


def test_debug_appends_the_caller(captured):
    log = enabled(debug=True, verbose=True)
    log(record("all_reduce", 8, 0.001, caller="reduce_gradients"))
    assert list(log.summary()) == ["all_reduce | [Caller Func: reduce_gradients]"]
    assert "comm op: all_reduce | [Caller Func: reduce_gradients] | time" in captured[0]


def test_straggler_columns_without_a_process_group():
    log = enabled()
    log(record("all_reduce", 8, 0.002))
    row = log.summary(show_straggler=True)["all_reduce"][8]
    assert row["total_straggler_ms"] == 0.0  # alone, nobody is waited for
    assert row["min_latency_ms"] == row["max_latency_ms"] == pytest.approx(2.0)
    table = render_table(log.summary(show_straggler=True), show_straggler=True)
    assert "Total Straggler(ms)" in table.splitlines()[0]


def test_plot_summary_draws_bytes_and_latency_per_op(tmp_path):
    from png_checks import assert_png, bars

    from deepspeed.comms_logging import plot_summary

    log = enabled()
    for op, size, seconds in (("all_reduce", 4096, 0.002), ("all_reduce", 4096, 0.004),
                              ("all_reduce", 1024, 0.001), ("broadcast", 2048, 0.003)):
        log.append(record(op, size, seconds))
    figure = plot_summary(log.log_summary(return_dict=True), tmp_path / "comms.png")
    assert_png(tmp_path / "comms.png")
    moved, latency = figure.axes
    mib = 2 ** 20
    assert bars(moved) == [("all_reduce", (2 * 4096 + 1024) / mib), ("broadcast", 2048 / mib)]
    assert [label for label, _ in bars(latency)] == ["all_reduce", "broadcast"]
    assert [round(ms, 6) for _, ms in bars(latency)] == [7.0, 3.0]
