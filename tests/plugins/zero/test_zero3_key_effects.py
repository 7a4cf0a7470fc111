"""ZeRO keys checked where their effect shows directly: which parameters stay whole
(``stage3_model_persistence_threshold``), the legacy ``allgather_size``, the NVMe parameter
buffers (``offload_param.buffer_size``, ``buffer_count``) and the ``aio`` section (top level or
inside ``zero_optimization``) with ``offload_optimizer.buffer_count``, as the swap handle
built from them reports."""
import pytest
import torch

from zero_models import LR, MICRO


def _persistent(zero):
    import deepspeed

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.Linear(16, 4))
    config = {"train_micro_batch_size_per_gpu": MICRO,
              "optimizer": {"type": "AdamW", "params": {"lr": LR}},
              "zero_optimization": dict({"stage": 3, "stage3_param_persistence_threshold": 50},
                                        **zero)}
    engine, *_ = deepspeed.initialize(model=model, config=config)
    engine.backward(engine(torch.randn(MICRO, 16)).pow(2).mean())
    engine.step()
    persistent = sorted(n for n, p in engine.module.named_parameters() if p.ds_persist)
    engine.destroy()
    return persistent


def test_model_persistence_threshold_caps_what_stays_whole(dist_pool):
    # both biases (16 and 4 elements) are under the parameter threshold of 50, the weights not
    [everything] = dist_pool.run(_persistent, world_size=1, args=({},))
    [capped] = dist_pool.run(_persistent, world_size=1,
                             args=({"stage3_model_persistence_threshold": 16},))
    [nothing] = dist_pool.run(_persistent, world_size=1,
                              args=({"stage3_model_persistence_threshold": 0},))
    assert everything == ["0.bias", "1.bias"]
    assert len(capped) == 1 and nothing == []


def test_allgather_size_is_the_legacy_name_of_the_all_gather_bucket_size():
    from deepspeed.zero.config import DeepSpeedZeroConfig

    assert DeepSpeedZeroConfig(stage=1, allgather_size=1000).allgather_bucket_size == 1000
    both = DeepSpeedZeroConfig(stage=1, allgather_size=1000, allgather_bucket_size=10)
    assert both.allgather_bucket_size == 10  # the current name wins


def test_offload_param_buffer_size_must_hold_a_shard(tmp_path):
    from deepspeed.zero.offload.param_store import NVMeShardStore

    store = NVMeShardStore(str(tmp_path), 0, buffer_size=8, max_in_cpu=0, buffer_count=2)
    assert store.swapper.buffer_count == 2  # offload_param.buffer_count bounds queued I/O

    param = torch.nn.Parameter(torch.zeros(1))
    param.ds_tensor, param.ds_numel, param.ds_id = torch.zeros(9), 18, 0
    with pytest.raises(ValueError, match="offload_param.buffer_size"):
        store.adopt(param)
    param.ds_tensor = torch.zeros(8)
    store.adopt(param)  # fits: goes to disk (max_in_cpu is 0)
    assert store.is_offloaded(param)
    store.close()


def _nvme_param_buffers(path, buffer_size):
    """The NVMe shard store ``initialize`` builds from ``offload_param``: its buffer size and
    swap buffer count, or the error when a shard does not fit one buffer."""
    import deepspeed

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.Linear(16, 4))
    offload = {"device": "nvme", "nvme_path": path, "max_in_cpu": 0, "buffer_count": 2,
               "buffer_size": buffer_size}
    config = {"train_micro_batch_size_per_gpu": MICRO,
              "optimizer": {"type": "AdamW", "params": {"lr": LR}},
              "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0,
                                    "offload_param": offload}}
    try:
        engine, *_ = deepspeed.initialize(model=model, config=config)
    except ValueError as err:
        return str(err)
    store = engine.module[0].weight.ds_partitioner.shard_store
    found = (store.buffer_size, store.swapper.buffer_count)
    engine.destroy()
    return found


def test_offload_param_buffers_come_from_the_config(dist_pool, tmp_path):
    # one rank: the 16 x 16 weight is a 256-element shard, which a 256-element buffer holds
    assert dist_pool.run(_nvme_param_buffers, world_size=1, args=(str(tmp_path), 256)) == \
        [(256, 2)]
    [error] = dist_pool.run(_nvme_param_buffers, world_size=1, args=(str(tmp_path), 100))
    assert "offload_param.buffer_size (100)" in error and "at least 256" in error


AIO = {"block_size": 8192, "queue_depth": 3, "intra_op_parallelism": 2, "single_submit": True,
       "overlap_events": False}


def _swap_handle(where, path):
    import deepspeed

    from zero_models import ds_config, make_model, param_groups

    zero = {"offload_optimizer": {"device": "nvme", "nvme_path": path, "buffer_count": 2}}
    config = ds_config(2, 1, **zero)
    if where == "top":
        config["aio"] = AIO
    else:
        config["zero_optimization"]["aio"] = AIO
    model = make_model()
    engine, optimizer, _, _ = deepspeed.initialize(
        model=model, model_parameters=param_groups(model), config=config)
    handle = optimizer.swapper.handle
    settings = {"block_size": handle.get_block_size(), "queue_depth": handle.get_queue_depth(),
                "intra_op_parallelism": handle.get_intra_op_parallelism(),
                "single_submit": handle.get_single_submit(),
                "overlap_events": handle.get_overlap_events(),
                "buffer_count": optimizer.swapper.buffer_count}
    engine.destroy()
    return settings


@pytest.mark.parametrize("where", ["top", "zero_optimization"])
def test_the_aio_section_configures_the_nvme_swap_handle(dist_pool, tmp_path, where):
    [settings] = dist_pool.run(_swap_handle, world_size=1, args=(where, str(tmp_path)))
    assert settings == dict(AIO, buffer_count=2)  # offload_optimizer.buffer_count too


def _masters_after_load(path, from_fp32):
    import deepspeed

    from zero_models import ds_config, make_model, param_groups, train

    def build():
        model = make_model()
        config = dict(ds_config(2, 1, load_from_fp32_weights=from_fp32), bf16={"enabled": True})
        return deepspeed.initialize(model=model, model_parameters=param_groups(model),
                                    config=config)[:2]

    engine, optimizer = build()
    train(engine, 2, 1)
    engine.save_checkpoint(path, tag="t")
    saved = [c.detach().clone() for c in optimizer.all_chunks]
    engine.destroy()
    engine, optimizer = build()
    engine.load_checkpoint(path, tag="t")
    loaded = [c.detach().clone() for c in optimizer.all_chunks]
    rounded = [c.to(torch.bfloat16).float() for c in saved]
    engine.destroy()
    return (all(torch.equal(a, b) for a, b in zip(loaded, saved)),
            all(torch.equal(a, b) for a, b in zip(loaded, rounded)))


def test_load_from_fp32_weights_chooses_the_masters_source(dist_pool, tmp_path):
    # true: the checkpoint's fp32 masters; false: the model's bf16 weights, rounded
    [(exact, _)] = dist_pool.run(_masters_after_load, world_size=1,
                                 args=(str(tmp_path / "fp32"), True))
    [(_, rounded)] = dist_pool.run(_masters_after_load, world_size=1,
                                   args=(str(tmp_path / "bf16"), False))
    assert exact and rounded


def _gathered_peak(prefetch):
    import deepspeed

    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(10, 10) for _ in range(6)])
    config = {"train_micro_batch_size_per_gpu": MICRO,
              "optimizer": {"type": "AdamW", "params": {"lr": LR}},
              "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0,
                                    "stage3_prefetch_bucket_size": prefetch}}
    engine, *_ = deepspeed.initialize(model=model, config=config)
    for _ in range(3):
        engine.backward(engine(torch.randn(MICRO, 10)).pow(2).mean())
        engine.step()
    peak = engine.plugins.get_plugin("zero").coordinator.gathered_peak
    engine.destroy()
    return peak


def test_prefetch_bucket_size_bounds_how_far_ahead_parameters_are_gathered(dist_pool):
    [none_ahead] = dist_pool.run(_gathered_peak, world_size=1, args=(0,))
    [far_ahead] = dist_pool.run(_gathered_peak, world_size=1, args=(10_000,))
    assert none_ahead == 110 and far_ahead > none_ahead  # one layer vs several
