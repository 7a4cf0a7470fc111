"""ZeRO-3 names code written against upstream uses: ``param.all_gather_coalesced``,
``deepspeed.runtime.zero.unwrap_model_for_generation`` and
``deepspeed.runtime.zero.parameter_offload.DeepSpeedZeRoOffload`` (one 2-rank call)."""
import torch


def _net():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.Tanh(), torch.nn.Linear(7, 3))


def _zero3_names():
    import deepspeed
    from deepspeed import comm as dist
    from deepspeed.runtime.zero import GatheredParameters, unwrap_model_for_generation
    from deepspeed.runtime.zero.parameter_offload import DeepSpeedZeRoOffload
    from deepspeed.zero import ZeroParamStatus

    out = {}
    x = torch.ones(2, 5)
    reference = _net()
    with torch.no_grad():
        expected = reference(x)

    engine, *_ = deepspeed.initialize(model=_net(), config={
        "train_micro_batch_size_per_gpu": 2, "zero_allow_untested_optimizer": True,
        "optimizer": {"type": "SGD", "params": {"lr": 0.1}},
        "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0}})
    params = list(engine.module.parameters())
    handle = params[0].all_gather_coalesced(params)
    handle.wait()
    out["coalesced"] = ([tuple(p.shape) for p in params],
                        all(p.ds_status is ZeroParamStatus.AVAILABLE for p in params),
                        torch.equal(params[0].detach(), reference[0].weight))
    params[0].partition(params)
    out["released"] = all(p.ds_status is ZeroParamStatus.NOT_AVAILABLE for p in params)

    gathers = []
    observer = (lambda record: gathers.append(record.op))
    dist.add_comm_observer(observer)
    try:
        with unwrap_model_for_generation(engine) as model:
            gathers.clear()
            with torch.no_grad():
                inside = [model(x) for _ in range(3)]
            out["gathers_inside"] = len(gathers)
            out["whole_inside"] = all(p.ds_status is ZeroParamStatus.AVAILABLE for p in params)
        out["partitioned_after"] = all(p.ds_status is ZeroParamStatus.NOT_AVAILABLE
                                       for p in params)
        gathers.clear()
        loss = engine(x).pow(2).mean()
        out["gathers_after"] = len(gathers)  # the hooks are back
        engine.backward(loss)
        engine.step()
    finally:
        dist.remove_comm_observer(observer)
    out["generation_output"] = all(torch.allclose(o, expected, atol=1e-6) for o in inside)

    plain = _net()
    offload = DeepSpeedZeRoOffload(plain, param_persistence_threshold=0)
    with torch.no_grad():
        y = plain(x)
    out["offload"] = (all(p.ds_status is ZeroParamStatus.NOT_AVAILABLE for p in plain.parameters()),
                      torch.allclose(y, expected, atol=1e-6),
                      offload.get_param_coordinator() is offload.param_coordinator)
    with GatheredParameters(list(plain.parameters())):
        out["offload_full"] = torch.equal(plain[2].weight.detach(), reference[2].weight)
    offload.destroy()
    try:
        DeepSpeedZeRoOffload(_net(), zero_quantized_weights=True)
    except ValueError as exc:
        out["refused"] = str(exc)
    return out


def test_zero3_upstream_names(dist_pool):
    for out in dist_pool.run(_zero3_names):
        shapes, available, equal = out["coalesced"]
        assert shapes == [(7, 5), (7,), (3, 7), (3,)] and available and equal
        assert out["released"]
        assert out["gathers_inside"] == 0 and out["whole_inside"]
        assert out["partitioned_after"] and out["gathers_after"] > 0
        assert out["generation_output"]
        assert out["offload"] == (True, True, True) and out["offload_full"]
        assert "zero_quantized_weights=True" in out["refused"]
