"""Memory estimators for ZeRO-2 and ZeRO-3 model states (params, gradients, optimizer states).

They answer "how much CPU and GPU memory per device do I need for this model under each offload
option?" before a run, from the parameter counts alone. Activations, kernels and temporary
buffers are not included. The formulas are the ones the DeepSpeed memory-requirements doc
derives for mixed precision + Adam (bytes per parameter):

* 2 fp16 params + 2 fp16 grads on the GPU unless partitioned away,
* 16 for fp32 params, grads, momentum and variance (the optimizer state, partitioned),
* 18 = 16 + 2 fp16 params when those live on the CPU too (ZeRO-3 param offload),
* 4 per param per GPU process while PyTorch first builds the model in fp32 on the CPU,
* ZeRO-3 gathers one layer at a time: 4 bytes (fp16 param + grad) per largest-layer param,

times `additional_buffer_factor` for the CPU figures. GB in the printed tables is 2**30 bytes.
"""
from typing import Iterable, Tuple

__all__ = [
    "estimate_zero2_model_states_mem_needs", "estimate_zero2_model_states_mem_needs_all_live",
    "estimate_zero2_model_states_mem_needs_all_cold", "estimate_zero3_model_states_mem_needs",
    "estimate_zero3_model_states_mem_needs_all_live", "estimate_zero3_model_states_mem_needs_all_cold",
    "model_param_counts",
]

GB = 2**30
_TITLE = "Estimated memory needed for params, optim states and gradients for a:"


def _check_setup(num_gpus_per_node, num_nodes, additional_buffer_factor) -> None:
    for name, value in (("num_gpus_per_node", num_gpus_per_node), ("num_nodes", num_nodes)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    if not additional_buffer_factor > 0:
        raise ValueError(f"additional_buffer_factor must be positive, got {additional_buffer_factor!r}")


def _plural(count: int, word: str) -> str:
    return f"{count} {word}" if count == 1 else f"{count} {word}s"


def _hw_line(num_gpus_per_node: int, num_nodes: int) -> str:
    return f"HW: Setup with {_plural(num_nodes, 'node')}, {_plural(num_gpus_per_node, 'GPU')} per node."


def _row(cpu_bytes: float, gpu_bytes: float, options: str) -> str:
    return f" {cpu_bytes / GB:7.2f}GB | {gpu_bytes / GB:6.2f}GB | {options}"


# -- ZeRO-2 -------------------------------------------------------------------------------------
def estimate_zero2_model_states_mem_needs(total_params, num_gpus_per_node=1, num_nodes=1,
                                          cpu_offload=True, additional_buffer_factor=1.5) -> Tuple[int, int]:
    """Per-process (cpu_bytes, gpu_bytes) for ZeRO-2 model states.

    With `cpu_offload` the GPU keeps only fp16 params (2T) and the CPU holds the fp32 optimizer
    state, at least 4 bytes per param per local process for the initial fp32 model build. Without
    it the GPU holds fp16 params and grads (4T) plus its 1/total_gpus share of the 16-byte
    optimizer state; the CPU only needs the initial fp32 model per local process.
    """
    _check_setup(num_gpus_per_node, num_nodes, additional_buffer_factor)
    total_gpus = num_nodes * num_gpus_per_node
    if cpu_offload:
        gpu_mem = 2 * total_params
        cpu_mem = total_params * max(4 * num_gpus_per_node, 16) * additional_buffer_factor
    else:
        gpu_mem = 4 * total_params + int(16 * total_params / total_gpus)
        cpu_mem = total_params * 4 * num_gpus_per_node * additional_buffer_factor
    return int(cpu_mem), int(gpu_mem)


def estimate_zero2_model_states_mem_needs_all_cold(total_params, num_gpus_per_node=1, num_nodes=1,
                                                   additional_buffer_factor=1.5) -> None:
    """Print the ZeRO-2 memory table for a hypothetical model of `total_params` parameters.

    Use this when the model is not at hand (or is too big to load just to count it);
    `estimate_zero2_model_states_mem_needs_all_live` derives the count from a model object.
    """
    _check_setup(num_gpus_per_node, num_nodes, additional_buffer_factor)
    lines = [_TITLE, _hw_line(num_gpus_per_node, num_nodes),
             f"SW: Model with {int(total_params / 1e6)}M total params.",
             "  per CPU  |  per GPU |   Options"]
    for offload in (True, False):
        cpu_mem, gpu_mem = estimate_zero2_model_states_mem_needs(
            total_params, num_gpus_per_node, num_nodes, cpu_offload=offload,
            additional_buffer_factor=additional_buffer_factor)
        lines.append(_row(cpu_mem, gpu_mem, f"offload_optimizer={'cpu' if offload else 'none'}"))
    print("\n".join(lines))


def estimate_zero2_model_states_mem_needs_all_live(model, num_gpus_per_node=1, num_nodes=1,
                                                   additional_buffer_factor=1.5) -> None:
    """Print the ZeRO-2 memory table for an actual `torch.nn.Module` (parameters counted once
    even when tied). For a model you cannot load, use `..._all_cold` with the count instead."""
    total_params, _ = model_param_counts(model)
    estimate_zero2_model_states_mem_needs_all_cold(total_params, num_gpus_per_node, num_nodes,
                                                   additional_buffer_factor)


# -- ZeRO-3 -------------------------------------------------------------------------------------
def estimate_zero3_model_states_mem_needs(total_params, largest_layer_params, num_gpus_per_node=1,
                                          num_nodes=1, cpu_offload=True, cpu_offload_params=True,
                                          zero_init=True, additional_buffer_factor=1.5) -> Tuple[int, int, int]:
    """Per-process (cpu_bytes, gpu_bytes, largest_layer_memory) for ZeRO-3 model states.

    `cpu_offload` is optimizer offload, `cpu_offload_params` parameter offload (only meaningful
    together with optimizer offload, as in the printed table). `zero_init` means the model is
    built partitioned under `deepspeed.zero.Init`, so no process ever holds the whole fp32 model
    and the CPU need is divided across nodes instead of multiplied by local processes.
    """
    _check_setup(num_gpus_per_node, num_nodes, additional_buffer_factor)
    total_gpus = num_nodes * num_gpus_per_node
    gpus_factor = 1 / num_nodes
    largest_layer_memory = 4 * largest_layer_params

    if cpu_offload and cpu_offload_params:
        gpu_mem = largest_layer_memory
        per_param = 18 * gpus_factor if zero_init else max(4 * num_gpus_per_node, 18 * gpus_factor)
        cpu_mem = total_params * per_param * additional_buffer_factor
    elif cpu_offload:
        gpu_mem = largest_layer_memory + int(2 * total_params / total_gpus)
        per_param = 16 * gpus_factor if zero_init else max(4 * num_gpus_per_node, 16 * gpus_factor)
        cpu_mem = total_params * per_param * additional_buffer_factor
    else:
        gpu_mem = largest_layer_memory + int(18 * total_params / total_gpus)
        built = largest_layer_params if zero_init else total_params
        cpu_mem = built * 4 * num_gpus_per_node * additional_buffer_factor
    return int(cpu_mem), int(gpu_mem), largest_layer_memory


def estimate_zero3_model_states_mem_needs_all_cold(total_params, largest_layer_params, num_gpus_per_node=1,
                                                   num_nodes=1, additional_buffer_factor=1.5) -> None:
    """Print the ZeRO-3 memory table for a hypothetical model.

    Pass `total_params` and `largest_layer_params` (the biggest number of parameters owned
    directly by one module) explicitly; `..._all_live` derives both from a model object.
    """
    _check_setup(num_gpus_per_node, num_nodes, additional_buffer_factor)
    lines = [_TITLE, _hw_line(num_gpus_per_node, num_nodes),
             f"SW: Model with {int(total_params / 1e6)}M total params, "
             f"{int(largest_layer_params / 1e6)}M largest layer params.",
             "  per CPU  |  per GPU |   Options"]
    for offload_param, offload_optimizer, zero_init in _zero3_rows():
        cpu_mem, gpu_mem, _ = estimate_zero3_model_states_mem_needs(
            total_params, largest_layer_params, num_gpus_per_node, num_nodes,
            cpu_offload=offload_optimizer == "cpu", cpu_offload_params=offload_param == "cpu",
            zero_init=zero_init, additional_buffer_factor=additional_buffer_factor)
        options = (f"offload_param={offload_param:4}, offload_optimizer={offload_optimizer:4}, "
                   f"zero_init={int(zero_init)}")
        lines.append(_row(cpu_mem, gpu_mem, options))
    print("\n".join(lines))


def _zero3_rows() -> Iterable[Tuple[str, str, bool]]:
    # Parameter offload without optimizer offload is not a supported combination: no row.
    for offload_param, offload_optimizer in (("cpu", "cpu"), ("none", "cpu"), ("none", "none")):
        for zero_init in (True, False):
            yield offload_param, offload_optimizer, zero_init


def estimate_zero3_model_states_mem_needs_all_live(model, num_gpus_per_node=1, num_nodes=1,
                                                   additional_buffer_factor=1.5) -> None:
    """Print the ZeRO-3 memory table for an actual `torch.nn.Module`: tied parameters count
    once in the total, and the largest layer is the module owning the most parameters directly."""
    total_params, largest_layer_params = model_param_counts(model)
    estimate_zero3_model_states_mem_needs_all_cold(total_params, largest_layer_params, num_gpus_per_node,
                                                   num_nodes, additional_buffer_factor)


# -- counting -----------------------------------------------------------------------------------
def model_param_counts(model) -> Tuple[int, int]:
    """(total params with shared tensors counted once, largest direct param count of a module).

    Sharing is detected by storage address as in the docs' recipe, falling back to identity for
    tensors without storage (meta device), so tied embeddings are not double counted.
    """
    unique = {}
    for param in model.parameters():
        ptr = param.data_ptr() if param.device.type != "meta" else 0
        unique[ptr if ptr else ("id", id(param))] = param.numel()
    total_params = sum(unique.values())
    largest_layer_params = max(
        (sum(p.numel() for p in module.parameters(recurse=False)) for module in model.modules()), default=0)
    return total_params, largest_layer_params
