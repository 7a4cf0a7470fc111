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
