"""What ``zero.Init`` reads from its ``config_dict_or_path``: the few ``zero_optimization``
values construction needs (dtype, parameter offload, ``override_module_apply``) and the NVMe
shard store of ``remote_device="nvme"``. Apart from partition_parameters.py, which holds the
partitioning itself."""
import torch

from deepspeed import comm as dist


def nvme_store(zero, pin_memory):
    """``remote_device="nvme"``: shards go to ``offload_param.nvme_path`` of the config."""
    from deepspeed.zero.offload.param_store import NVMeShardStore

    offload = (zero or {}).get("offload_param_section") or {}
    if not offload.get("nvme_path"):
        raise ValueError("zero.Init(remote_device='nvme') needs config_dict_or_path with "
                         "zero_optimization.offload_param.nvme_path (where the shards go)")
    return NVMeShardStore(offload["nvme_path"], dist.get_rank(),
                          buffer_count=int(offload.get("buffer_count", 5)),
                          buffer_size=int(float(offload.get("buffer_size", 100_000_000))),
                          max_in_cpu=int(float(offload.get("max_in_cpu", 1_000_000_000))),
                          pin_memory=pin_memory)


def zero_section(source):
    """The few ``zero_optimization`` values ``Init`` needs, from a config dict / path."""
    if source is None:
        return None
    from deepspeed.config import load_config_source

    raw = source.raw if hasattr(source, "raw") else load_config_source(source)
    zero = raw.get("zero_optimization") or {}
    if not isinstance(zero, dict):
        zero = {}
    dtype = None
    if (raw.get("bf16") or raw.get("bfloat16") or {}).get("enabled"):
        dtype = torch.bfloat16
    elif (raw.get("fp16") or {}).get("enabled"):
        dtype = torch.float16

    offload = zero.get("offload_param") or {}
    override = zero.get("override_module_apply", True)
    if not isinstance(override, bool):
        raise ValueError(f"zero_optimization.override_module_apply must be true or false, got "
                         f"{override!r}")
    # read through the section's model, as the engine reads every key: one validation, and a
    # tool that resets a validated key (tools/spec/verify_key_effects.py) reaches Init too
    from deepspeed.zero.config import DeepSpeedZeroConfig

    override = DeepSpeedZeroConfig.model_validate(
        {"override_module_apply": override}).override_module_apply
    return {"dtype": dtype,
            "offload_device": str(offload.get("device", "none")).lower(),
            "offload_param_section": offload,
            "override_module_apply": override}

