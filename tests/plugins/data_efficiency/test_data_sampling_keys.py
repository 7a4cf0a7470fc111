"""``data_efficiency.data_sampling`` keys seen on the loader ``deepspeed.initialize`` returns
with ``training_data`` (one gloo rank): its worker count and pinning, and the epochs its
sampler draws for."""
import torch
from de_helpers import IdDataset, analyze, metric_config

MICRO = 4


def _loader(path, sampling):
    import deepspeed

    config = metric_config(path)
    config["data_sampling"].update(sampling)
    model = torch.nn.Linear(4, 1)
    engine, _, loader, _ = deepspeed.initialize(
        model=model, model_parameters=model.parameters(), training_data=IdDataset(),
        config={"train_micro_batch_size_per_gpu": MICRO, "data_efficiency": config,
                "optimizer": {"type": "SGD", "params": {"lr": 0.01}}})
    seen = (loader.num_workers, loader.pin_memory, loader.data_sampler.total_global_batches)
    engine.destroy()
    return seen


def test_num_workers_pin_memory_and_num_epochs_reach_the_loader(dist_pool, tmp_path):
    analyze(tmp_path)
    [(workers, pinned, batches)] = dist_pool.run(
        _loader, world_size=1, args=(str(tmp_path), {"num_workers": 2, "pin_memory": True,
                                                     "num_epochs": 3}))
    [(_, _, fewer)] = dist_pool.run(_loader, world_size=1,
                                    args=(str(tmp_path), {"num_epochs": 1}))
    assert (workers, pinned) == (2, True)
    assert batches == 3 * fewer


def test_seed_fixes_the_draw(tmp_path):
    from deepspeed.data_efficiency import DeepSpeedDataSampler

    analyze(tmp_path)

    def first_batches(seed):
        config = dict(metric_config(tmp_path), seed=seed)
        sampler = DeepSpeedDataSampler(config, 400, micro_batch_size=8, data_parallel_rank=0,
                                       data_parallel_size=1)
        it = iter(sampler)
        return [list(next(it)) for _ in range(3)]

    assert first_batches(7) == first_batches(7)
    assert first_batches(7) != first_batches(8)
