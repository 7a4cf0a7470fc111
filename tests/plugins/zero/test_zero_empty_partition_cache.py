"""``engine.empty_partition_cache()`` (API reference, ZeRO-3 "GPU Memory Management") on 2 gloo
ranks: after training, every parameter ZeRO-3 kept whole (the persistent small ones) is
released to its shard, nothing keeps their full buffers alive, and training then goes on
exactly as single-process AdamW on the global batch."""
import torch

from zero_models import ds_config, make_model, param_groups, reference_phases, train

GAS = 1


def _train_empty_and_go_on():
    import deepspeed
    from deepspeed.zero import ZeroParamStatus

    model = make_model()
    # biases (13, 5, 7, 3 elements) and unused.weight (9) persist; the other weights do not
    config = ds_config(3, GAS, stage3_param_persistence_threshold=14)
    engine, *_ = deepspeed.initialize(model=model, model_parameters=param_groups(model),
                                      config=config)
    train(engine, 2, GAS)
    params = [p for p in engine.module.parameters() if hasattr(p, "ds_id")]
    whole_before = sum(p.ds_status is not ZeroParamStatus.NOT_AVAILABLE for p in params)
    persistent = sum(p.ds_persist for p in params)
    engine.empty_partition_cache()
    after = {
        "whole": sum(p.ds_status is not ZeroParamStatus.NOT_AVAILABLE for p in params),
        "data_elements": sum(p.data.numel() for p in params),
        "full_buffers": sum(getattr(p, "_ds_full", None) is not None for p in params),
        "refresh_plans": engine.optimizer._refreshers,
    }
    trained = train(engine, 2, GAS, first_step=2)
    return whole_before, persistent, after, trained


def test_empty_partition_cache_releases_then_training_goes_on(dist_pool):
    expected = reference_phases([(2, 2), (2, 2)], GAS)
    for whole_before, persistent, after, trained in dist_pool.run(_train_empty_and_go_on):
        # five persist; the three used in forward are whole after training: something to free
        assert persistent == 5 and whole_before >= 3
        assert after == {"whole": 0, "data_elements": 0, "full_buffers": 0,
                         "refresh_plans": None}
        assert trained.keys() == expected.keys()
        for name, want in expected.items():
            torch.testing.assert_close(trained[name], want, rtol=0, atol=1e-6, msg=name)


def _stage_2_has_nothing_to_free():
    import deepspeed

    model = make_model()
    engine, *_ = deepspeed.initialize(model=model, model_parameters=param_groups(model),
                                      config=ds_config(2, GAS))
    train(engine, 1, GAS)
    before = {n: p.detach().clone() for n, p in engine.module.named_parameters()}
    engine.empty_partition_cache()
    return all(torch.equal(p, before[n]) for n, p in engine.module.named_parameters())


def test_empty_partition_cache_is_a_no_op_below_stage_3(dist_pool):
    assert dist_pool.run(_stage_2_has_nothing_to_free) == [True, True]
