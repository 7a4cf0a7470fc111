"""``DeepSpeedDataSampler``: batches drawn only from samples whose difficulty is within the
curriculum's current threshold (upstream: ``deepspeed.runtime.data_pipeline.data_sampling.
data_sampler``).

At global step t (1, 2, ...) every metric's scheduler gives its threshold d(t). A sample is
eligible when, for every ``schedule_based`` metric, its value is <= d(t) (``difficulty_type:
value``) or its rank by that metric is within the lowest d(t) percent (``percentile``, the
buckets of ``<metric>_index_to_sample_percentile_merged``). ``single_cluster`` metrics filter
nothing: their difficulty is only handed to the post-process function (seqlen truncation).

The global batch (micro batch x gradient accumulation x data-parallel size) is drawn from one
shuffled queue of eligible samples, the same on every rank (same seed); newly eligible samples
join the queue and it is reshuffled; an exhausted queue is refilled with every eligible sample.
Rank r takes its own slice of each micro step, so ranks draw disjoint samples under the same
threshold. The draw is a pure function of (seed, config, number of batches drawn), so resuming
from a checkpoint replays the count and continues with the same next batches.
"""
import math
import os

import numpy as np

from .curriculum_scheduler import CurriculumScheduler
from .indexed_dataset import MMapIndexedDataset


def load_metric_values(name, metric, num_samples):
    """Per-sample values of ``metric`` from its index files, checked against the dataset."""
    where = f"data_efficiency.data_sampling.curriculum_learning.curriculum_metrics.{name}"
    paths = {}
    for key in ("index_to_sample_path", "index_to_metric_path"):
        path = getattr(metric, key)
        for suffix in (".idx", ".bin"):
            if not os.path.isfile(path + suffix):
                raise FileNotFoundError(f"{where}.{key}: {path}{suffix} does not exist (the "
                                        f"path is the prefix of a DataAnalyzer index file)")
        paths[key] = path
    index_to_sample = MMapIndexedDataset(paths["index_to_sample_path"])
    index_to_metric = MMapIndexedDataset(paths["index_to_metric_path"])
    if len(index_to_sample) != len(index_to_metric):
        raise ValueError(f"{where}: {paths['index_to_sample_path']} has "
                         f"{len(index_to_sample)} items but {paths['index_to_metric_path']} has "
                         f"{len(index_to_metric)}: they come from different analyses")
    values = np.full(num_samples, np.nan)
    total = int(np.sum(index_to_sample.sizes, dtype=np.int64))
    if total != num_samples:
        raise ValueError(f"{where}: {paths['index_to_sample_path']} indexes {total} samples but "
                         f"the dataset has {num_samples}: the index files were written for "
                         f"another dataset")
    for k in range(len(index_to_sample)):
        ids = np.asarray(index_to_sample[k], dtype=np.int64)
        if ids.size and (ids.min() < 0 or ids.max() >= num_samples):
            raise ValueError(f"{where}: {paths['index_to_sample_path']} names sample "
                             f"{int(ids.max())}, outside a dataset of {num_samples} samples")
        values[ids] = float(index_to_metric[k][0])
    if np.isnan(values).any():
        raise ValueError(f"{where}: {paths['index_to_sample_path']} does not cover every "
                         f"sample (e.g. sample {int(np.flatnonzero(np.isnan(values))[0])})")
    return values


class DeepSpeedDataSampler:
    """A batch sampler: iterating yields this rank's micro batches (lists of sample ids)."""

    def __init__(self, data_efficiency_config, one_epoch_total_samples, micro_batch_size,
                 data_parallel_rank, data_parallel_size, data_parallel_group=None,
                 gradient_accumulation_steps=1, global_rank=0, drop_last=True):
        from .config import DataEfficiencyConfig

        config = data_efficiency_config
        if isinstance(config, dict):
            config = DataEfficiencyConfig(**config)
        if not 0 <= data_parallel_rank < data_parallel_size:
            raise ValueError(f"data_parallel_rank {data_parallel_rank} outside "
                             f"[0, {data_parallel_size})")
        self.config = config
        self.num_samples = int(one_epoch_total_samples)
        self.micro_batch_size = micro_batch_size
        self.dp_rank, self.dp_size = data_parallel_rank, data_parallel_size
        self.gas = gradient_accumulation_steps
        self.global_batch_size = micro_batch_size * data_parallel_size * self.gas
        if self.num_samples < 1:
            raise ValueError("DeepSpeedDataSampler needs a non-empty dataset")
        total = config.data_sampling.num_epochs * self.num_samples
        self.total_global_batches = (total // self.global_batch_size if drop_last
                                     else math.ceil(total / self.global_batch_size))
        cl = config.data_sampling.curriculum_learning
        self.metrics = dict(cl.curriculum_metrics) if cl.enabled else {}
        self.schedulers = {}
        self.metric_values = {}
        self.metric_ranks = {}
        for name, metric in self.metrics.items():
            where = f"data_efficiency.data_sampling.curriculum_learning.curriculum_metrics.{name}"
            self.schedulers[name] = CurriculumScheduler(metric.model_dump(), where=where)
            if metric.clustering_type == "schedule_based":
                values = load_metric_values(name, metric, self.num_samples)
                self.metric_values[name] = values
                if metric.difficulty_type == "percentile":
                    ranks = np.empty(self.num_samples, dtype=np.int64)
                    ranks[np.argsort(values, kind="stable")] = np.arange(self.num_samples)
                    self.metric_ranks[name] = ranks
        self.reset()

    # ------------------------------------------------------------------ state
    def reset(self):
        self.rng = np.random.default_rng(self.config.seed)
        self.curriculum_step = 0
        self.global_batches = 0
        self.queue = np.zeros(0, dtype=np.int64)
        self.eligible = np.zeros(self.num_samples, dtype=bool)
        self._difficulties_of_mask = None
        for name, scheduler in self.schedulers.items():
            scheduler.set_current_difficulty(scheduler.min_difficulty)

    def set_custom_curriculum_learning_schedule(self, schedule_func_dict):
        for name, func in schedule_func_dict.items():
            if name not in self.schedulers:
                raise KeyError(f"custom schedule for unknown curriculum metric '{name}'; "
                               f"configured metrics: {sorted(self.schedulers)}")
            self.schedulers[name].set_custom_get_difficulty(func)

    def current_difficulties(self):
        return {name: s.get_current_difficulty() for name, s in self.schedulers.items()}

    def state_dict(self):
        return {"global_batches": self.global_batches, "curriculum_step": self.curriculum_step,
                "current_difficulties": self.current_difficulties()}

    # ------------------------------------------------------------------ drawing
    def _eligible_mask(self):
        mask = np.ones(self.num_samples, dtype=bool)
        for name, values in self.metric_values.items():
            metric, d = self.metrics[name], self.schedulers[name].get_current_difficulty()
            if metric.difficulty_type == "value":
                mask &= values <= d
            else:
                percent = int(min(100, max(0, math.floor(d))))
                cut = percent * (self.num_samples // 100) + min(percent, self.num_samples % 100)
                mask &= self.metric_ranks[name] < cut
        return mask

    def _update_pool(self):
        difficulties = tuple(sorted(self.current_difficulties().items()))
        if difficulties == self._difficulties_of_mask:
            return
        self._difficulties_of_mask = difficulties
        mask = self._eligible_mask()
        if (self.eligible & ~mask).any():  # a custom schedule may lower a threshold
            self.queue = self.queue[mask[self.queue]]
        new = np.flatnonzero(mask & ~self.eligible)
        self.eligible = mask
        if new.size:
            self.queue = np.concatenate([self.queue, new])
            self.rng.shuffle(self.queue)

    def get_next_global_batch(self):
        self.curriculum_step += 1
        for scheduler in self.schedulers.values():
            scheduler.update_difficulty(self.curriculum_step)
        self._update_pool()
        out = []
        while len(out) < self.global_batch_size:
            if not self.queue.size:
                pool = np.flatnonzero(self.eligible)
                if not pool.size:
                    raise ValueError(f"no sample is eligible at curriculum step "
                                     f"{self.curriculum_step}: difficulties "
                                     f"{self.current_difficulties()} are below every sample's "
                                     f"metric; raise min_difficulty")
                self.queue = self.rng.permutation(pool)
            take = min(self.global_batch_size - len(out), self.queue.size)
            out.extend(self.queue[:take].tolist())
            self.queue = self.queue[take:]
        self.global_batches += 1
        return out

    def micro_batches_of(self, global_batch):
        """This rank's micro batches of one global batch, in micro-step order."""
        mb, dp = self.micro_batch_size, self.dp_size
        return [global_batch[(m * dp + self.dp_rank) * mb:(m * dp + self.dp_rank + 1) * mb]
                for m in range(self.gas)]

    def fast_forward(self, micro_batches):
        """Replay the draws up to ``micro_batches`` of this rank's micro batches (resume)."""
        self.reset()
        self._pending = []
        full, rest = divmod(micro_batches, self.gas)
        for _ in range(full):
            self.get_next_global_batch()
        if rest:
            self._pending = self.micro_batches_of(self.get_next_global_batch())[rest:]

    def __iter__(self):
        pending, self._pending = getattr(self, "_pending", []), []
        yield from pending
        while self.global_batches < self.total_global_batches:
            yield from self.micro_batches_of(self.get_next_global_batch())

    def __len__(self):
        return self.total_global_batches * self.gas
