"""``tensor_parallel.injection_policy_tuple`` chooses the row-parallel Linears of the AutoTP
training split (two gloo ranks)."""


def _row_parallel(policy):
    import torch

    import deepspeed
    from tp_train_helpers import ds_config, registered_groups_restored, tiny_llama

    config = ds_config(2)
    if policy is not None:
        config["tensor_parallel"]["injection_policy_tuple"] = policy
    with registered_groups_restored():
        model = deepspeed.tp_model_init(tiny_llama(), tp_size=2, dtype=torch.float32,
                                        config=config)
    layer = model.model.layers[0]
    return type(layer.self_attn.o_proj).__name__, type(layer.mlp.down_proj).__name__


def test_injection_policy_tuple_names_the_row_parallel_layers(dist_pool):
    assert dist_pool.run(_row_parallel, world_size=2, args=(None,))[0] == \
        ("RowParallelLinear", "RowParallelLinear")  # AutoTP's own choice
    only_attention = dist_pool.run(_row_parallel, world_size=2, args=(("o_proj",),))[0]
    assert only_attention[0] == "RowParallelLinear" and only_attention[1] != "RowParallelLinear"


def _backward_with(overlap):
    """One backward of the tiny Llama split over 2 ranks at ``deepspeed.initialize``: every
    parameter's gradient, and the ``async_op`` of each all-reduce backward issued."""
    import torch

    import deepspeed
    import deepspeed.comm as dist
    from tp_train_helpers import ds_config, global_batches, registered_groups_restored, tiny_llama

    config = ds_config(2)
    config["tensor_parallel"]["tp_overlap_comm"] = overlap
    issued, all_reduce = [], dist.all_reduce

    def recording(tensor, *args, async_op=False, **kwargs):
        issued.append(async_op)
        return all_reduce(tensor, *args, async_op=async_op, **kwargs)

    with registered_groups_restored():
        engine, *_ = deepspeed.initialize(model=tiny_llama(), config=config)
        ids = global_batches(1, 1)[0]
        loss = engine(input_ids=ids, labels=ids).loss
        dist.all_reduce = recording
        try:
            engine.backward(loss)
        finally:
            dist.all_reduce = all_reduce
        grads = {name: p.grad.clone() for name, p in engine.module.named_parameters()}
        engine.destroy()
    return grads, issued


def test_tp_overlap_comm_reduces_input_grads_asynchronously(dist_pool):
    import torch

    plain, plain_issued = dist_pool.run(_backward_with, world_size=2, args=(False,))[0]
    overlapped, issued = dist_pool.run(_backward_with, world_size=2, args=(True,))[0]
    assert True not in plain_issued
    # per block: q, k, v (one shared input) and gate, up (another) each reduce their own
    assert issued.count(True) == 2 * 5 and issued.count(False) == plain_issued.count(False) - 2 * 2
    assert plain.keys() == overlapped.keys()
    for name, grad in plain.items():
        torch.testing.assert_close(overlapped[name], grad, rtol=1e-5, atol=1e-6, msg=name)


def _shard_placement(keep_on_host):
    """Where ``tp_model_init`` left the split Linears and the rest of the model when the
    accelerator's device is ``meta`` (a stand-in for a GPU: no data is moved)."""
    import torch

    import deepspeed
    from deepspeed.accelerator import get_accelerator
    from tp_train_helpers import ds_config, registered_groups_restored, tiny_llama

    config = ds_config(2)
    config["tensor_parallel"]["keep_module_on_host"] = keep_on_host
    accelerator = get_accelerator()
    accelerator.current_device_name = lambda: "meta"  # an instance attribute shadows it
    try:
        with registered_groups_restored():
            model = deepspeed.tp_model_init(tiny_llama(), tp_size=2, dtype=torch.float32,
                                            config=config)
    finally:
        del accelerator.current_device_name
    layer = model.model.layers[0]
    split = [layer.self_attn.q_proj.weight, layer.self_attn.o_proj.weight,
             layer.mlp.down_proj.weight]
    whole = [model.model.embed_tokens.weight, layer.input_layernorm.weight]
    return {p.device.type for p in split}, {p.device.type for p in whole}


def test_keep_module_on_host_keeps_the_shards_on_the_host(dist_pool):
    moved = dist_pool.run(_shard_placement, world_size=2, args=(False,))
    kept = dist_pool.run(_shard_placement, world_size=2, args=(True,))
    # by default each shard goes to the device as it is cut, the unsplit rest stays put
    assert moved == [({"meta"}, {"cpu"})] * 2
    assert kept == [({"cpu"}, {"cpu"})] * 2
