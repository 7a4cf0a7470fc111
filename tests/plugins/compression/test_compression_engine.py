"""The engine drives both sections on 2 gloo ranks: MoQ's bits step down on the documented
schedule, and the compression schedule advances at every optimizer step. Engines run in the
rank processes (never in the pytest process)."""
import pytest
import torch

ENGINE = {"train_micro_batch_size_per_gpu": 4,
          "optimizer": {"type": "AdamW", "params": {"lr": 0.01}}}


def _moq_run(steps):
    import deepspeed
    from deepspeed import comm as dist

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    config = {**ENGINE, "quantize_training": {
        "enabled": True, "quantize_groups": 2, "quantize_bits": {"start_bits": 8, "target_bits": 4},
        "quantize_schedule": {"quantize_period": 2, "schedule_offset": 0}}}
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                      config=config)
    bits, distinct = [], []
    g = torch.Generator().manual_seed(dist.get_rank())
    for _ in range(steps):
        loss = engine(torch.randn(4, 8, generator=g)).pow(2).mean()
        engine.backward(loss)
        engine.step()
        bits.append(engine.quantize_bits())
        distinct.append(max(row.unique().numel() for p in (model[0].weight, model[2].weight)
                            for row in p.detach().reshape(2, -1)))
    engine.destroy()
    return bits, distinct


def test_moq_bits_step_down_on_schedule(dist_pool):
    for bits, distinct in dist_pool.run(_moq_run, args=(18,)):
        # period 2 doubling at each drop: the drops come at steps 2, 4, 8 and 16
        expected = [8 - sum(drop <= step for drop in (2, 4, 8, 16)) for step in range(1, 19)]
        assert expected[:9] == [8, 7, 7, 6, 6, 6, 6, 5, 5] and expected[-4:] == [5, 4, 4, 4]
        assert bits == expected
        assert all(d <= 2 ** b for d, b in zip(distinct, bits))
        assert distinct[-1] > 2 ** 3  # not trivially few: 4-bit groups use more than 8 values


def _compression_run(steps, zero_stage=0):
    import deepspeed
    from deepspeed.compression.compress import init_compression

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    compression = {"compression_training": {
        "weight_quantization": {
            "shared_parameters": {"enabled": True, "schedule_offset": 2,
                                  "quantize_weight_in_forward": True},
            "different_groups": {"wq1": {"params": {"start_bits": 8, "target_bits": 6,
                                                    "quantization_period": 2},
                                         "modules": ["0"]}}},
        "sparse_pruning": {
            "shared_parameters": {"enabled": True, "schedule_offset": 3, "method": "l1"},
            "different_groups": {"sp1": {"params": {"dense_ratio": 0.5}, "modules": ["2"]}}}}}
    init_compression(model, compression)
    # the engine's config omits the section: the compressed layers alone enable the plugin
    config = {**ENGINE, "zero_optimization": {"stage": zero_stage}}
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                      config=config)
    bits, zeros = [], []
    for _ in range(steps):
        engine.backward(engine(torch.randn(4, 8)).pow(2).mean())
        engine.step()
        bits.append(model[0].weight_bits)
        zeros.append(int((model[2].weight == 0).sum()))
    has_scheduler = engine.compression_scheduler is not None
    engine.destroy()
    return bits, zeros, has_scheduler


@pytest.mark.parametrize("zero_stage", [0, 2])
def test_engine_advances_the_compression_schedule(dist_pool, zero_stage):
    for bits, zeros, has_scheduler in dist_pool.run(_compression_run, args=(8, zero_stage)):
        assert has_scheduler
        assert bits == [None, 8, 8, 7, 7, 6, 6, 6]
        assert zeros[:2] == [0, 0] and all(z == 32 for z in zeros[2:])


def _bf16_and_resume(save_dir):
    import deepspeed
    from deepspeed.compression.compress import init_compression

    compression = {"compression_training": {
        "weight_quantization": {
            "shared_parameters": {"enabled": True, "schedule_offset": 1,
                                  "quantize_weight_in_forward": True},
            "different_groups": {"wq1": {"params": {"start_bits": 8, "target_bits": 4,
                                                    "quantization_period": 1},
                                         "modules": ["0", "2"]}}},
        "row_pruning": {
            "shared_parameters": {"enabled": True, "method": "topk", "schedule_offset": 0},
            "different_groups": {"rp1": {"params": {"dense_ratio": 0.5}, "modules": ["^0$"],
                                         "related_modules": [["^2$"]]}}}}}
    config = {**ENGINE, "bf16": {"enabled": True}, **compression}

    def engine_for():
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(),
                                    torch.nn.Linear(16, 4))
        init_compression(model, config)
        engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                          config=config)
        return engine, model

    engine, model = engine_for()
    for _ in range(3):
        x = torch.randn(4, 8, dtype=torch.bfloat16)
        engine.backward(engine(x).float().pow(2).mean())
        engine.step()
    saved_bits = model[0].weight_bits
    out_dtype = engine(torch.randn(4, 8, dtype=torch.bfloat16)).dtype
    engine.save_checkpoint(save_dir, tag="t")
    engine.destroy()
    resumed, fresh_model = engine_for()
    fresh_bits = fresh_model[0].weight_bits
    resumed.load_checkpoint(save_dir, tag="t")
    loaded_bits = fresh_model[0].weight_bits
    resumed.destroy()
    return str(out_dtype), saved_bits, fresh_bits, loaded_bits


def test_bf16_engine_and_checkpointed_schedule(dist_pool, tmp_path):
    for dtype, saved, fresh, loaded in dist_pool.run(_bf16_and_resume, args=(str(tmp_path),)):
        assert dtype == "torch.bfloat16"
        assert (saved, fresh, loaded) == (6, None, 6)


def _forgot_init_compression():
    import logging

    import deepspeed
    from deepspeed.utils.logging import logger

    records = []
    handler = logging.Handler()
    handler.emit = records.append
    logger.addHandler(handler)
    try:
        model = torch.nn.Linear(4, 4)
        config = {**ENGINE, "compression_training": {"sparse_pruning": {
            "shared_parameters": {"enabled": True},
            "different_groups": {"sp1": {"params": {"dense_ratio": 0.5}}}}}}
        engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                          config=config)
        engine.destroy()
    finally:
        logger.removeHandler(handler)
    return [r.getMessage() for r in records if r.levelno >= logging.WARNING]


def test_config_without_init_compression_is_warned_about(dist_pool):
    warnings = dist_pool.run(_forgot_init_compression)[0]
    assert any("init_compression" in w for w in warnings), warnings
