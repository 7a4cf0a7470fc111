"""The offline map-reduce against ground truth computed here, and the indexed-dataset format."""
import numpy as np
import pytest
import torch

from deepspeed.data_efficiency import (DataAnalyzer, DistributedDataAnalyzer, MMapIndexedDataset,
                                       MMapIndexedDatasetBuilder)
from deepspeed.data_efficiency.indexed_dataset import read_all
from deepspeed.testing.distributed import run_distributed

N = 1000


class Lengths(torch.utils.data.Dataset):
    """Sample i is a token sequence whose length is a fixed pseudo-random number in [1, 40]."""

    def __init__(self, n=N):
        self.lengths = np.random.default_rng(3).integers(1, 41, size=n)

    def __len__(self):
        return len(self.lengths)

    def __getitem__(self, i):
        return torch.tensor([int(self.lengths[i])])


def seqlen(batch):
    return batch[:, 0]


def token_count(batch):
    return batch[:, 0].sum().reshape(1)


def analyzer(ds, path, workers, worker, threads):
    return DataAnalyzer(ds, num_workers=workers, worker_id=worker, num_threads=threads,
                        batch_size=64, metric_names=["seqlen", "tokens"],
                        metric_functions=[seqlen, token_count],
                        metric_types=["single_value_per_sample", "accumulate_value_over_samples"],
                        metric_dtypes=[np.int64, np.int64], save_path=str(path),
                        show_progress=False)


def check_index(path, lengths):
    base = f"{path}/seqlen/seqlen"
    s2m = read_all(base + "_sample_to_metric")
    assert [int(v[0]) for v in s2m] == lengths.tolist()
    values = [int(v[0]) for v in read_all(base + "_index_to_metric")]
    assert values == sorted(set(lengths.tolist()))
    for value, samples in zip(values, read_all(base + "_index_to_sample")):
        assert samples.tolist() == np.flatnonzero(lengths == value).tolist()
    merged = read_all(base + "_index_to_sample_percentile_merged")
    assert len(merged) == 100
    order = np.argsort(lengths, kind="stable")
    assert np.concatenate(merged).tolist() == order.tolist()
    assert [len(m) for m in merged] == [10] * 100
    total = read_all(f"{path}/tokens/tokens_metric_value")[0]
    assert int(total[0]) == int(lengths.sum())


def test_map_reduce_2_workers_x_2_threads(tmp_path):
    ds = Lengths()
    for worker in range(2):
        analyzer(ds, tmp_path, 2, worker, 2).run_map()
    analyzer(ds, tmp_path, 2, 0, 2).run_reduce()
    check_index(tmp_path, ds.lengths)


def test_a_progress_bar_counts_samples_on_a_terminal(tmp_path, monkeypatch):
    import io
    import sys

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    for stream, drawn in ((Terminal(), True), (io.StringIO(), False)):
        monkeypatch.setattr(sys, "stderr", stream)
        worker = analyzer(Lengths(100), tmp_path / str(drawn), 1, 0, 1)
        worker.show_progress = True
        worker.run_map()
        assert ("DataAnalyzer worker 0 thread 0" in stream.getvalue()
                and "/100 " in stream.getvalue()) == drawn


def test_reduce_names_missing_shard(tmp_path):
    ds = Lengths(100)
    analyzer(ds, tmp_path, 2, 0, 1).run_map()  # worker 1 never ran
    with pytest.raises(FileNotFoundError, match="worker1_thread0"):
        analyzer(ds, tmp_path, 2, 0, 1).run_reduce()


def test_reduce_refuses_shards_of_another_dataset(tmp_path):
    analyzer(Lengths(100), tmp_path, 1, 0, 1).run_map()
    with pytest.raises(ValueError, match="another dataset"):
        analyzer(Lengths(120), tmp_path, 1, 0, 1).run_reduce()


def test_bad_metric_specs_are_named(tmp_path):
    with pytest.raises(ValueError, match="metric_type .per_sample. is not one of"):
        DataAnalyzer(Lengths(10), metric_names=["a"], metric_functions=[seqlen],
                     metric_types=["per_sample"], metric_dtypes=[np.int64], save_path=str(tmp_path))
    with pytest.raises(ValueError, match="metric_dtypes has 0"):
        DataAnalyzer(Lengths(10), metric_names=["a"], metric_functions=[seqlen],
                     metric_types=["single_value_per_sample"], metric_dtypes=[])

    class NoLen(torch.utils.data.IterableDataset):
        def __iter__(self):
            yield torch.zeros(1)

    with pytest.raises(TypeError, match="__len__"):
        analyzer(NoLen(), tmp_path, 1, 0, 1)


def test_indexed_dataset_round_trip(tmp_path):
    rng = np.random.default_rng(0)
    items = [rng.integers(0, 1000, size=rng.integers(0, 9)) for _ in range(50)]
    for dtype in (np.int32, np.uint16, np.float64):
        prefix = str(tmp_path / f"ds_{np.dtype(dtype).name}")
        builder = MMapIndexedDatasetBuilder(prefix + ".bin", dtype=dtype)
        for item in items:
            builder.add_item(item)
        builder.finalize()
        ds = MMapIndexedDataset(prefix)
        assert len(ds) == 50 and ds.dtype == np.dtype(dtype)
        for got, want in zip(read_all(prefix), items):
            assert got.tolist() == want.astype(dtype).tolist()
        assert ds.sizes.tolist() == [len(i) for i in items]
    with pytest.raises(ValueError, match="float32"):
        MMapIndexedDatasetBuilder(str(tmp_path / "x"), dtype=np.float32)
    with pytest.raises(FileNotFoundError, match="nothere.idx"):
        MMapIndexedDataset(str(tmp_path / "nothere"))
    (tmp_path / "junk.idx").write_bytes(b"not an index")
    (tmp_path / "junk.bin").write_bytes(b"")
    with pytest.raises(ValueError, match="not an MMIDIDX"):
        MMapIndexedDataset(str(tmp_path / "junk"))


def _distributed_analysis(path):
    ds = Lengths()
    DistributedDataAnalyzer(ds, batch_size=64, metric_names=["seqlen", "tokens"],
                            metric_functions=[seqlen, token_count],
                            metric_types=["single_value_per_sample",
                                          "accumulate_value_over_samples"],
                            metric_dtypes=[np.int64, np.int64], save_path=path,
                            show_progress=False).run_map_reduce()
    return ds.lengths.tolist()


def test_distributed_analyzer_on_2_ranks(tmp_path):
    lengths = run_distributed(_distributed_analysis, world_size=2, args=(str(tmp_path),))[0]
    check_index(tmp_path, np.asarray(lengths))
