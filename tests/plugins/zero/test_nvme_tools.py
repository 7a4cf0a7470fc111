"""``ds_io`` and ``ds_nvme_tune`` on a temporary folder with tiny sizes: the benchmark moves the
bytes it says (validated), cleans up its files, and the sweep's JSON is the configuration of its
fastest logged run; bad flags and sweep files are refused with the offending name."""
import json
import re

import pytest

from deepspeed.zero.nvme import ds_io_main, parse_size, sweep_main
from deepspeed.zero.nvme.io_bench import HandleConfig, _Worker, run_io


def _speed(out, line):
    return float(re.search(rf"{line} = ([0-9.]+)", out).group(1))


@pytest.mark.parametrize("mode", ["--write", "--read"])
def test_ds_io_moves_validated_bytes_and_cleans_up(tmp_path, capsys, mode):
    folder = tmp_path / "nvme"
    assert ds_io_main(["--folder", str(folder), "--io_size", "192K", mode, "--block_size", "64K",
                       "--queue_depth", "4", "--intra_op_parallelism", "2", "--threads", "2",
                       "--loops", "2", "--validate", "--handle"]) == 0
    out = capsys.readouterr().out
    name = mode[2:].capitalize()
    assert "192K x 2 file(s), block_size=65536 queue_depth=4 intra_op_parallelism=2" in out
    assert "validated" in out
    assert _speed(out, f"Task {name} Speed") > 0 and _speed(out, f"E2E {name} Speed") > 0
    assert _speed(out, f"E2E {name} Latency") >= _speed(out, f"Task {name} Latency")
    assert list(folder.iterdir()) == []


def test_validation_catches_a_changed_file(tmp_path):
    worker = _Worker(str(tmp_path), 0, "read", 8192, HandleConfig(block_size=4096), "cpu",
                     "handle", False, True)
    with open(worker.path, "r+b") as f:
        f.seek(5000)
        f.write(b"\x00\xff")
    with pytest.raises(RuntimeError, match="validation failed: read of"):
        worker.run_once()
    worker.remove()


def test_run_io_totals_bytes_over_workers(tmp_path):
    result = run_io([str(tmp_path / "a"), str(tmp_path / "b")], 64 << 10, "write",
                    HandleConfig(block_size=16 << 10), loops=1, threads=2)
    assert result.total_bytes == 4 * (64 << 10)
    assert result.task_gbs == pytest.approx(result.total_bytes / result.task_seconds / 1e9)


def test_ds_nvme_tune_prints_the_fastest_logged_config(tmp_path, capsys):
    sweep = tmp_path / "sweep.json"
    sweep.write_text(json.dumps({"block_size": ["16K", "64K"], "io_parallel": [1, 2],
                                 "queue_depth": [8], "single_submit": [False],
                                 "overlap_events": [True]}))
    logs = tmp_path / "logs"
    assert sweep_main(["--nvme_dir", str(tmp_path / "nvme"), "--io_size", "128K", "--loops", "1",
                       "--sweep_config", str(sweep), "--log_dir", str(logs)]) == 0
    out = capsys.readouterr().out
    best = json.loads(out[out.index("{"):])
    assert set(best["aio"]) == {"block_size", "queue_depth", "intra_op_parallelism",
                                "single_submit", "overlap_events"}
    runs = {}
    for log in logs.iterdir():
        config, *lines = log.read_text().splitlines()
        op = log.name.split("_")[0]
        runs.setdefault(op, []).append((_speed("\n".join(lines), f"Task {op.capitalize()} Speed"),
                                        json.loads(config)))
    assert sorted(runs) == ["read", "write"] and len(runs["read"]) == len(runs["write"]) == 4
    fastest_read = max(speed for speed, _ in runs["read"])
    # two configs can log the same speed (the logs round it): the tool may pick either
    assert best in [config for speed, config in runs["read"] if speed == fastest_read]
    reported = re.search(r"Best performance \(GB/sec\): read = ([0-9.]+), write = ([0-9.]+)", out)
    assert float(reported.group(1)) == pytest.approx(fastest_read, abs=1e-3)
    assert float(reported.group(2)) == pytest.approx(max(r[0] for r in runs["write"]), abs=1e-3)


def test_bad_flags_and_sweeps_are_named(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"blocksize": [4096]}))
    with pytest.raises(SystemExit):
        sweep_main(["--nvme_dir", str(tmp_path), "--sweep_config", str(bad)])
    assert "'blocksize' is unknown; allowed: block_size" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        sweep_main(["--nvme_dir", str(tmp_path), "--no_read", "--no_write"])
    with pytest.raises(SystemExit, match="--gpu needs an accelerator device"):
        ds_io_main(["--folder", str(tmp_path), "--gpu"])
    with pytest.raises(SystemExit):
        ds_io_main(["--folder", str(tmp_path), "--io_size", "4Q"])
    assert "--io_size '4Q' is not a positive size" in capsys.readouterr().err
    assert parse_size("4M") == 4 << 20 and parse_size("128k") == 128 << 10 and parse_size("1GB") == 1 << 30
