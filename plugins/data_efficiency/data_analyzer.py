"""Offline data analysis: compute a difficulty metric for every sample and write the index files
the curriculum sampler reads (upstream: ``deepspeed.runtime.data_pipeline.data_sampling.
data_analyzer``).

It is a map-reduce on CPU. **Map** (``DataAnalyzer.run_map``, one call per worker, e.g. one per
node): the worker's contiguous share of the dataset is split over ``num_threads`` processes, each
computing the metrics batch by batch and writing its values under
``save_path/<metric>/worker<w>_thread<t>/``. **Reduce** (``run_reduce``, once, after every worker
finished): the shards are merged into, per metric ``m`` (in ``save_path/m/``):

- ``m_sample_to_metric``: item i = [metric of sample i]
- ``m_index_to_metric``: item k = [k-th distinct metric value, ascending]
- ``m_index_to_sample``: item k = the ids of the samples whose metric is that value
- ``m_index_to_sample_percentile_merged``: 100 items, item p = the samples ranked in the
  p-th percentile by metric (ties in sample order)
- ``m_metric_value`` (``accumulate_value_over_samples`` metrics): the sum over all samples

Keep the number of distinct values to a few thousand: the index holds one item per value.
``DistributedDataAnalyzer`` does the same over the ranks of a ``deepspeed.comm`` group, in memory.
"""
import multiprocessing
import os

import numpy as np
import torch

from deepspeed.utils.progress import progress

from .indexed_dataset import MMapIndexedDataset, MMapIndexedDatasetBuilder, dtype_code, exists

METRIC_TYPES = ("single_value_per_sample", "accumulate_value_over_samples")
SHARD_FILE = "{metric}_shard_values"


def split_range(total, parts, index):
    """``[start, end)`` of part ``index`` of ``parts`` nearly equal contiguous parts."""
    base, extra = divmod(total, parts)
    start = index * base + min(index, extra)
    return start, start + base + (1 if index < extra else 0)


def dataset_length(dataset, who):
    try:
        return len(dataset)
    except TypeError:
        raise TypeError(f"{who} needs a dataset with __len__ (it splits the samples over workers "
                        f"and threads); got a {type(dataset).__name__} without one") from None


def check_metrics(names, functions, types, dtypes):
    if not names:
        raise ValueError("metric_names is empty: name at least one metric to analyze")
    for what, values in (("metric_functions", functions), ("metric_types", types),
                         ("metric_dtypes", dtypes)):
        if len(values) != len(names):
            raise ValueError(f"{what} has {len(values)} entries but metric_names has "
                             f"{len(names)} ({names}); give one per metric")
    for name, kind, dtype in zip(names, types, dtypes):
        if kind not in METRIC_TYPES:
            raise ValueError(f"metric '{name}': metric_type {kind!r} is not one of "
                             f"{', '.join(METRIC_TYPES)}")
        dtype_code(dtype)


def _as_numpy(value):
    if torch.is_tensor(value):
        return value.detach().cpu().numpy()
    return np.asarray(value)


def compute_metrics(dataset, indices, batch_size, names, functions, types, collate_fn,
                    desc=None):
    """``{metric: values}`` over ``dataset[indices]``: per-sample values (in order) for
    ``single_value_per_sample``, the accumulated array for ``accumulate_value_over_samples``."""
    from torch.utils.data import DataLoader, Subset

    loader = DataLoader(Subset(dataset, list(indices)), batch_size=batch_size, shuffle=False,
                        collate_fn=collate_fn)
    per_sample = {n: [] for n, t in zip(names, types) if t == METRIC_TYPES[0]}
    accumulated = {}
    bar = progress(total=len(indices), desc=desc, unit="sample", leave=False,
                   enabled=desc is not None)
    for batch in loader:
        count = None
        for name, fn, kind in zip(names, functions, types):
            value = _as_numpy(fn(batch))
            if kind == METRIC_TYPES[0]:
                value = value.reshape(-1)
                per_sample[name].append(value)
                count = len(value)
            else:
                accumulated[name] = value if name not in accumulated else accumulated[name] + value
        bar.update(count if count is not None else batch_size)
    bar.close()
    out = {n: (np.concatenate(v) if v else np.zeros(0)) for n, v in per_sample.items()}
    out.update(accumulated)
    for name, kind in zip(names, types):
        if kind == METRIC_TYPES[0] and len(out[name]) != len(indices):
            raise ValueError(f"metric '{name}' returned {len(out[name])} values for "
                             f"{len(indices)} samples: a single_value_per_sample metric "
                             f"function must return one value per sample of the batch")
        out.setdefault(name, np.zeros(0))
    return out


def write_single(prefix, values, dtype):
    builder = MMapIndexedDatasetBuilder(prefix, dtype=dtype)
    builder.add_item(np.asarray(values).reshape(-1))
    builder.finalize()


def write_metric_index(metric_dir, name, values, dtype):
    """The four index files of a ``single_value_per_sample`` metric from all its values."""
    os.makedirs(metric_dir, exist_ok=True)
    values = np.asarray(values, dtype=dtype)
    base = os.path.join(metric_dir, name)
    s2m = MMapIndexedDatasetBuilder(f"{base}_sample_to_metric", dtype=dtype)
    s2m.add_items(values, np.ones(len(values), dtype=np.int64))
    s2m.finalize()
    order = np.argsort(values, kind="stable")  # ties keep sample order
    distinct, starts = np.unique(values[order], return_index=True)
    bounds = list(starts) + [len(values)]
    i2m = MMapIndexedDatasetBuilder(f"{base}_index_to_metric", dtype=dtype)
    i2s = MMapIndexedDatasetBuilder(f"{base}_index_to_sample", dtype=np.int64)
    i2m.add_items(distinct, np.ones(len(distinct), dtype=np.int64))
    i2s.add_items(order, np.diff(bounds))
    i2m.finalize()
    i2s.finalize()
    merged = MMapIndexedDatasetBuilder(f"{base}_index_to_sample_percentile_merged",
                                       dtype=np.int64)
    merged.add_items(order, [np.subtract(*split_range(len(values), 100, p)[::-1])
                             for p in range(100)])
    merged.finalize()


class DataAnalyzer:
    """Map-reduce analysis on one machine; see the module docstring."""

    def __init__(self, dataset, num_workers=1, worker_id=0, num_threads=1, num_threads_reduce=1,
                 specific_threads=None, batch_size=1, metric_names=(), metric_functions=(),
                 metric_types=(), metric_dtypes=(), save_path="./", collate_fn=None,
                 show_progress=True, **unsupported):
        if unsupported:  # upstream's custom_map_* / custom_reduce hooks
            raise TypeError(f"DataAnalyzer does not support {', '.join(sorted(unsupported))} "
                            f"in this build; compute custom metrics in metric_functions")
        if num_workers < 1 or not 0 <= worker_id < num_workers:
            raise ValueError(f"worker_id {worker_id} must be in [0, num_workers={num_workers})")
        if num_threads < 1 or batch_size < 1:
            raise ValueError(f"num_threads ({num_threads}) and batch_size ({batch_size}) must "
                             f"be >= 1")
        self.dataset = dataset
        self.num_samples = dataset_length(dataset, "DataAnalyzer")
        self.num_workers, self.worker_id, self.num_threads = num_workers, worker_id, num_threads
        self.specific_threads = list(specific_threads or range(num_threads))
        self.batch_size = batch_size
        self.metric_names, self.metric_functions = list(metric_names), list(metric_functions)
        self.metric_types, self.metric_dtypes = list(metric_types), list(metric_dtypes)
        check_metrics(self.metric_names, self.metric_functions, self.metric_types,
                      self.metric_dtypes)
        self.save_path = save_path
        self.collate_fn = collate_fn
        self.show_progress = show_progress

    # ------------------------------------------------------------------ map
    def thread_range(self, worker_id, thread_id):
        start, end = split_range(self.num_samples, self.num_workers, worker_id)
        t_start, t_end = split_range(end - start, self.num_threads, thread_id)
        return start + t_start, start + t_end

    def shard_prefix(self, name, worker_id, thread_id):
        return os.path.join(self.save_path, name, f"worker{worker_id}_thread{thread_id}",
                            SHARD_FILE.format(metric=name))

    def run_map_thread(self, thread_id):
        start, end = self.thread_range(self.worker_id, thread_id)
        desc = (f"DataAnalyzer worker {self.worker_id} thread {thread_id}"
                if self.show_progress else None)
        values = compute_metrics(self.dataset, range(start, end), self.batch_size,
                                 self.metric_names, self.metric_functions, self.metric_types,
                                 self.collate_fn, desc)
        for name, dtype in zip(self.metric_names, self.metric_dtypes):
            prefix = self.shard_prefix(name, self.worker_id, thread_id)
            os.makedirs(os.path.dirname(prefix), exist_ok=True)
            write_single(prefix, values[name], dtype)

    def run_map(self):
        """Analyze this worker's share with ``num_threads`` processes (inline for one)."""
        threads = self.specific_threads
        if len(threads) == 1:
            self.run_map_thread(threads[0])
            return
        methods = multiprocessing.get_all_start_methods()
        context = multiprocessing.get_context("fork" if "fork" in methods else "spawn")
        procs = [context.Process(target=self.run_map_thread, args=(t,)) for t in threads]
        for proc in procs:
            proc.start()
        for proc in procs:
            proc.join()
        failed = [t for t, proc in zip(threads, procs) if proc.exitcode != 0]
        if failed:
            raise RuntimeError(f"DataAnalyzer worker {self.worker_id}: map threads {failed} "
                               f"failed (exit codes "
                               f"{[procs[threads.index(t)].exitcode for t in failed]})")

    # ------------------------------------------------------------------ reduce
    def _shard_values(self, name, dtype):
        parts = []
        for worker in range(self.num_workers):
            for thread in range(self.num_threads):
                prefix = self.shard_prefix(name, worker, thread)
                if not exists(prefix):
                    raise FileNotFoundError(
                        f"DataAnalyzer reduce: {prefix}.idx/.bin is missing; run run_map() "
                        f"for worker {worker} (all {self.num_workers} workers x "
                        f"{self.num_threads} threads) with the same save_path first")
                parts.append(np.array(MMapIndexedDataset(prefix)[0]))
        return parts

    def run_reduce(self):
        for name, kind, dtype in zip(self.metric_names, self.metric_types, self.metric_dtypes):
            metric_dir = os.path.join(self.save_path, name)
            parts = self._shard_values(name, dtype)
            if kind == METRIC_TYPES[0]:
                values = np.concatenate(parts)
                if len(values) != self.num_samples:
                    raise ValueError(f"DataAnalyzer reduce: the shards of '{name}' hold "
                                     f"{len(values)} values for a dataset of "
                                     f"{self.num_samples} samples: they were mapped from "
                                     f"another dataset or worker/thread layout")
                write_metric_index(metric_dir, name, values, dtype)
            else:
                total = parts[0].astype(np.float64)
                for part in parts[1:]:
                    total = total + part
                write_single(os.path.join(metric_dir, f"{name}_metric_value"), total, dtype)


class DistributedDataAnalyzer:
    """The same analysis over the ranks of ``deepspeed.comm`` (each rank one contiguous share,
    gathered in memory to rank 0, which writes the files), for datasets that fit the job."""

    def __init__(self, dataset, num_workers=None, worker_id=None, batch_size=1,
                 metric_names=(), metric_functions=(), metric_types=(), metric_dtypes=(),
                 save_path="./", collate_fn=None, device="cpu", comm_group=None,
                 show_progress=True, **unsupported):
        from deepspeed import comm as dist

        if unsupported:
            raise TypeError(f"DistributedDataAnalyzer does not support "
                            f"{', '.join(sorted(unsupported))} in this build")
        self.dist = dist
        self.group = comm_group
        self.num_workers = dist.get_world_size(group=comm_group) if num_workers is None \
            else num_workers
        self.worker_id = dist.get_rank(group=comm_group) if worker_id is None else worker_id
        self.dataset = dataset
        self.num_samples = dataset_length(dataset, "DistributedDataAnalyzer")
        self.batch_size = batch_size
        self.metric_names, self.metric_functions = list(metric_names), list(metric_functions)
        self.metric_types, self.metric_dtypes = list(metric_types), list(metric_dtypes)
        check_metrics(self.metric_names, self.metric_functions, self.metric_types,
                      self.metric_dtypes)
        self.save_path, self.collate_fn, self.show_progress = save_path, collate_fn, show_progress

    def run_map_reduce(self):
        start, end = split_range(self.num_samples, self.num_workers, self.worker_id)
        desc = f"DistributedDataAnalyzer rank {self.worker_id}" if self.show_progress else None
        values = compute_metrics(self.dataset, range(start, end), self.batch_size,
                                 self.metric_names, self.metric_functions, self.metric_types,
                                 self.collate_fn, desc)
        gathered = [None] * self.num_workers
        self.dist.all_gather_object(gathered, values, group=self.group)
        if self.worker_id == 0:
            for name, kind, dtype in zip(self.metric_names, self.metric_types,
                                         self.metric_dtypes):
                metric_dir = os.path.join(self.save_path, name)
                parts = [g[name] for g in gathered]
                if kind == METRIC_TYPES[0]:
                    write_metric_index(metric_dir, name, np.concatenate(parts), dtype)
                else:
                    os.makedirs(metric_dir, exist_ok=True)
                    write_single(os.path.join(metric_dir, f"{name}_metric_value"),
                                 sum(p.astype(np.float64) for p in parts), dtype)
        self.dist.barrier(group=self.group)
