"""Shared pieces of the data-efficiency tests: a dataset whose samples carry their id and a
known metric, and the analysis writing its index files."""
import math

import numpy as np
import torch

N = 400


def lengths(n=N):
    return np.random.default_rng(5).integers(1, 41, size=n)


class IdDataset(torch.utils.data.Dataset):
    """Sample i = (features, i); its metric ("seqlen") is ``lengths()[i]``."""

    def __init__(self, n=N):
        self.lengths = lengths(n)

    def __len__(self):
        return len(self.lengths)

    def __getitem__(self, i):
        return torch.full((4,), float(self.lengths[i])), i


def analyze(path, n=N):
    from deepspeed.data_efficiency import DataAnalyzer

    ds = IdDataset(n)
    DataAnalyzer(ds, batch_size=50, metric_names=["seqlen"],
                 metric_functions=[lambda batch: batch[0][:, 0].long()],
                 metric_types=["single_value_per_sample"], metric_dtypes=[np.int64],
                 save_path=str(path), show_progress=False).run_map()
    DataAnalyzer(ds, batch_size=50, metric_names=["seqlen"], metric_functions=[None],
                 metric_types=["single_value_per_sample"], metric_dtypes=[np.int64],
                 save_path=str(path), show_progress=False).run_reduce()


def metric_config(path, **overrides):
    base = f"{path}/seqlen/seqlen"
    metric = {"index_to_sample_path": base + "_index_to_sample",
              "index_to_metric_path": base + "_index_to_metric",
              "difficulty_type": "value", "clustering_type": "schedule_based",
              "min_difficulty": 5, "max_difficulty": 40, "schedule_type": "fixed_linear",
              "schedule_config": {"total_curriculum_step": 12, "difficulty_step": 1}}
    metric.update(overrides)
    return {"enabled": True, "seed": 7,
            "data_sampling": {"enabled": True, "num_epochs": 100,
                              "curriculum_learning": {"enabled": True,
                                                      "curriculum_metrics": {"seqlen": metric}}}}


def linear_threshold(t, lo=5, hi=40, total=12, step=1):
    d = math.floor(min(t / total, 1.0) * (hi - lo) + lo)
    return min(d - d % step, hi)
