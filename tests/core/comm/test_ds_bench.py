"""``ds_bench`` on 2 gloo ranks of the warm pool: every op at every scanned size gives one row
whose bandwidths follow from the bytes and the measured time, the table is printed by rank 0
only, and each size's data was checked (a wrong result raises instead of reporting a number)."""
import io

import pytest

from deepspeed.comm.benchmark import BUS_FACTOR, OPS, message_sizes, parse_args, run_benchmarks


def _bench(argv):
    import deepspeed.comm as dist

    out = io.StringIO()
    rows = run_benchmarks(parse_args(argv), out)
    return dist.get_rank(), [vars(r) for r in rows], out.getvalue()


def _bench_with_broken_all_reduce():
    import deepspeed.comm as dist
    from deepspeed.comm import benchmark

    class Broken(benchmark._Case):
        def __call__(self, async_op=False):
            if self.op == "all_reduce" and dist.get_rank() == 1:
                self.input.add_(1)  # the "collective" leaves rank 1 with wrong data
            return super().__call__(async_op)

    saved, benchmark._Case = benchmark._Case, Broken
    try:
        benchmark.run_benchmarks(parse_args(["--all-reduce", "--scan", "--maxsize", "2",
                                             "--trials", "1", "--warmups", "0"]), io.StringIO())
    except RuntimeError as err:
        return str(err)
    finally:
        benchmark._Case = saved
    return "no error"


def test_every_op_every_size_on_two_ranks(dist_pool):
    argv = ["--scan", "--maxsize", "4", "--trials", "2", "--warmups", "1", "--bw-unit", "GBps"]
    results = dist_pool.run(_bench, world_size=2, args=(argv,))
    (rank0, rows0, text0), (rank1, rows1, text1) = sorted(results, key=lambda r: r[0])
    assert (rank0, rank1) == (0, 1)
    assert [(r["op"], r["elements"]) for r in rows0] == [(op, n) for op in OPS for n in (2, 4, 8)]
    assert rows0 == rows1  # every rank reports the slowest rank's time
    for row in rows0:
        itemsize = 4
        expected_bytes = row["elements"] * itemsize * (2 if row["op"] == "all_gather" else 1)
        assert row["nbytes"] == expected_bytes
        assert row["seconds"] > 0
        assert row["algbw"] == pytest.approx(row["nbytes"] / row["seconds"])
        assert row["busbw"] == pytest.approx(row["algbw"] * BUS_FACTOR[row["op"]](2))
    assert text1 == ""
    for op in OPS:
        assert f"Performance of {op} on 2 ranks" in text0
    assert "Throughput (GBps)" in text0 and "BusBW (GBps)" in text0


def test_wrong_collective_data_is_an_error_not_a_number(dist_pool):
    messages = dist_pool.run(_bench_with_broken_all_reduce, world_size=2)
    assert "all_reduce of 2 elements returned wrong data on rank" in messages[1]


def test_single_size_fits_the_memory_share():
    args = parse_args(["--all-gather", "--maxsize", "20", "--mem-factor", "0.5"])
    # 2**19 fp32 elements x (1 input + 4 gathered) buffers = 10 MiB > 0.5 * 4 MiB: halve to fit
    (elements,) = message_sizes(args, "all_gather", 4, 4, free_bytes=4 << 20)
    assert elements * 4 * 5 <= 2 << 20 < elements * 2 * 4 * 5
    with pytest.raises(SystemExit):
        parse_args(["--dtype", "floaty"])


def _main_once():
    from deepspeed.comm.benchmark import main

    return main(["--broadcast", "--maxsize", "3", "--trials", "1", "--warmups", "0"])


def test_console_entry_adopts_the_existing_group(dist_pool):
    """``main`` as the console script runs it, in ranks whose group is already up (as under
    the launcher after an earlier init): one unscanned size, exit status 0 everywhere."""
    assert dist_pool.run(_main_once, world_size=2) == [0, 0]
