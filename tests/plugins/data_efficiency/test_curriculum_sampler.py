"""Curriculum data sampling through ``deepspeed.initialize(training_data=...)`` on 2 ranks:
thresholds, disjoint shards, resume; and the sampler alone for percentiles and bad input."""
import re

import numpy as np
import pytest
import torch

from de_helpers import IdDataset, analyze, lengths, linear_threshold, metric_config
from deepspeed.testing.distributed import run_distributed

MICRO = 4


def _engine(path, extra=None):
    import deepspeed

    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    config = {"train_micro_batch_size_per_gpu": MICRO, "steps_per_print": 10 ** 6,
              "optimizer": {"type": "SGD", "params": {"lr": 0.01}},
              "data_efficiency": metric_config(path, **(extra or {}))}
    engine, _, loader, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                                config=config, training_data=IdDataset())
    return engine, loader


def _train(engine, loader, steps, save_at=None, ckpt=None):
    records = []
    it = iter(loader)
    for step in range(steps):
        x, ids = next(it)
        engine.backward(engine(x).sum())
        engine.step()
        records.append((ids.tolist(), loader.data_sampler.current_difficulties()["seqlen"]))
        if save_at is not None and step + 1 == save_at:
            engine.save_checkpoint(ckpt)
    return records


def _run(path, ckpt, steps, save_at):
    engine, loader = _engine(path)
    records = _train(engine, loader, steps, save_at, ckpt)
    engine.destroy()
    resumed_engine, resumed_loader = _engine(path)
    resumed_engine.load_checkpoint(ckpt)
    resumed = _train(resumed_engine, resumed_loader, steps - save_at)
    resumed_engine.destroy()
    return records, resumed


def test_curriculum_sampler_on_2_ranks(tmp_path):
    analyze(tmp_path / "analysis")
    steps, save_at = 16, 6
    results = run_distributed(_run, world_size=2, timeout=120,
                              args=(str(tmp_path / "analysis"), str(tmp_path / "ckpt"), steps,
                                    save_at))
    metric = lengths()
    for t in range(steps):
        threshold = linear_threshold(t + 1)
        drawn = []
        for records, _ in results:
            ids, difficulty = records[t]
            assert difficulty == threshold
            assert all(metric[i] <= threshold for i in ids), (t, threshold, ids)
            drawn.append(set(ids))
            assert len(ids) == MICRO
        assert not drawn[0] & drawn[1], f"ranks share samples at step {t + 1}"
    for records, resumed in results:
        assert resumed == records[save_at:]
    # the curriculum ends with every sample reachable
    assert linear_threshold(steps) == 40 >= metric.max()


def _custom_and_post_process(path):
    engine, loader = _engine(path, {"schedule_type": "custom", "schedule_config": {}})
    asked = []
    engine.set_custom_curriculum_learning_schedule(
        {"seqlen": lambda step: asked.append(step) or 10 + step})
    seen_states = []
    engine.set_data_post_process_func(
        lambda batch, state: seen_states.append(state["current_difficulties"]["seqlen"]) or
        (batch[0][:, :2], batch[1]))
    shapes, ok = [], True
    it = iter(loader)
    for _ in range(3):
        x, ids = next(it)
        shapes.append(tuple(x.shape))
        ok &= all(lengths()[i] <= seen_states[-1] for i in ids.tolist())
    engine.destroy()
    return asked, seen_states, shapes, ok


def test_custom_schedule_and_post_process_on_2_ranks(tmp_path):
    analyze(tmp_path)
    for asked, seen, shapes, ok in run_distributed(_custom_and_post_process, world_size=2,
                                                   args=(str(tmp_path),)):
        assert asked == [1, 2, 3] and seen == [11, 12, 13]
        assert shapes == [(MICRO, 2)] * 3 and ok


def test_percentile_difficulty(tmp_path):
    from deepspeed.data_efficiency import DeepSpeedDataSampler

    analyze(tmp_path)
    config = metric_config(tmp_path, difficulty_type="percentile", min_difficulty=10,
                           max_difficulty=100,
                           schedule_config={"total_curriculum_step": 9, "difficulty_step": 10})
    sampler = DeepSpeedDataSampler(config, 400, micro_batch_size=8, data_parallel_rank=0,
                                   data_parallel_size=1)
    ranks = np.empty(400, dtype=np.int64)
    ranks[np.argsort(lengths(), kind="stable")] = np.arange(400)
    it = iter(sampler)
    for t in range(1, 12):
        ids = next(it)
        percent = linear_threshold(t, 10, 100, 9, 10)
        assert sampler.current_difficulties()["seqlen"] == percent
        assert all(ranks[i] < 4 * percent for i in ids), (t, percent)


def test_single_cluster_metric_filters_nothing(tmp_path):
    # clustering_type "single_cluster": the metric's difficulty is scheduled (and handed to the
    # post-process function) but does not filter, so samples above the threshold are drawn
    from deepspeed.data_efficiency import DeepSpeedDataSampler

    analyze(tmp_path)
    config = metric_config(tmp_path, clustering_type="single_cluster")
    sampler = DeepSpeedDataSampler(config, 400, micro_batch_size=32, data_parallel_rank=0,
                                   data_parallel_size=1)
    ids = next(iter(sampler))
    assert sampler.current_difficulties()["seqlen"] == linear_threshold(1)
    assert max(lengths()[i] for i in ids) > linear_threshold(1)


def test_bad_index_files(tmp_path):
    from deepspeed.data_efficiency import DeepSpeedDataSampler

    with pytest.raises(FileNotFoundError, match="index_to_sample_path.*seqlen_index_to_sample"):
        DeepSpeedDataSampler(metric_config(tmp_path), 400, 4, 0, 1)
    analyze(tmp_path, n=300)
    with pytest.raises(ValueError, match="indexes 300 samples but the dataset has 400"):
        DeepSpeedDataSampler(metric_config(tmp_path), 400, 4, 0, 1)


CONFIG_ERROR_CASES = [({"schedule_type": "fixed_root"}, "root_degree"),
                      ({"min_difficulty": 50}, "min_difficulty \\(50"),
                      ({"index_to_metric_path": None}, "index_to_metric_path is required")]


def _config_errors(path):
    """In a worker: ``initialize`` brings up the distributed backend, which must not be left
    initialised in the pytest process (later tests check behaviour without one)."""
    import deepspeed
    from deepspeed.config import DeepSpeedConfigError

    messages = []
    for override, _ in CONFIG_ERROR_CASES:
        config = {"train_micro_batch_size_per_gpu": 1,
                  "data_efficiency": metric_config(path, **override)}
        try:
            deepspeed.initialize(model=torch.nn.Linear(2, 2), config=config)
        except (DeepSpeedConfigError, ValueError) as err:
            messages.append(str(err))
        else:
            messages.append(None)
    return messages


def test_config_errors_name_the_key(tmp_path):
    messages = run_distributed(_config_errors, world_size=1, args=(str(tmp_path),))[0]
    for (_, pattern), message in zip(CONFIG_ERROR_CASES, messages):
        assert message is not None and re.search(pattern, message), (pattern, message)


def _no_len(path):
    import deepspeed

    class Stream(torch.utils.data.IterableDataset):
        def __iter__(self):
            yield torch.zeros(4), 0

    model = torch.nn.Linear(4, 1)
    try:
        deepspeed.initialize(model=model, model_parameters=model.parameters(),
                             config={"train_micro_batch_size_per_gpu": 1,
                                     "optimizer": {"type": "SGD", "params": {"lr": 0.1}},
                                     "data_efficiency": metric_config(path)},
                             training_data=Stream())
    except TypeError as err:
        return str(err)
    return None


def test_dataset_without_len(tmp_path):
    analyze(tmp_path)
    message = run_distributed(_no_len, world_size=1, args=(str(tmp_path),))[0]
    assert message is not None and "__len__" in message and "Stream" in message
