"""``replace_transformer_layer``: upstream's module-replacement entry point: AutoTP's tensor
slicing, then with ``replace_with_kernel_inject`` the fused path of ``kernel_inject``."""
from deepspeed.inference.policies import as_linear_names
from deepspeed.tensor_parallel import AutoTP, policy_from_injection, shard_model


def replace_transformer_layer(orig_layer_impl, model, checkpoint_dict=None, config=None,
                              model_config=None):
    """Split ``model`` over ``config.tensor_parallel`` (a ``DeepSpeedInferenceConfig``):
    ``orig_layer_impl`` (a block class) with the row-parallel names of
    ``config.injection_policy_tuple`` / ``config.injection_policy``, or AutoTP's policy when
    neither names them. Returns ``model``."""
    from deepspeed import comm as dist

    if config is None:
        raise ValueError("replace_transformer_layer needs config (a DeepSpeedInferenceConfig)")
    tp = config.tensor_parallel
    if tp.tp_size == 1:
        return _inject(model, config)
    if config.injection_policy:
        policy = policy_from_injection(as_linear_names(config.injection_policy))
    elif orig_layer_impl is not None and config.injection_policy_tuple:
        policy = policy_from_injection({orig_layer_impl: config.injection_policy_tuple})
    else:
        policy = AutoTP.tp_parser(model)
    group = tp.tp_group
    rank = dist.get_rank(group=group) if group is not None else dist.get_rank() % tp.tp_size
    shard_model(model, policy, tp.tp_size, rank, group)
    return _inject(model, config)


def _inject(model, config):
    """The fused path of ``replace_with_kernel_inject`` (CPU: SDPA only, one log line)."""
    if config.replace_with_kernel_inject:
        import torch

        from deepspeed.accelerator import get_accelerator
        from deepspeed.inference.kernel_inject import inject

        inject(model, get_accelerator().device_name() == "cuda" and torch.cuda.is_available())
    return model
