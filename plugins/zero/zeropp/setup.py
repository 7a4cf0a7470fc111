"""Turning the ZeRO++ / MixZ++ keys of ``zero_optimization`` into a ``ZeroPPComm`` at
``initialize``, after refusing the combinations that cannot work (each error names the keys)."""
import types

from deepspeed import comm as dist
from deepspeed.utils.logging import logger
from deepspeed.zero.zeropp.comm import ZeroPPComm, zeropp_requested
from deepspeed.zero.zeropp.mixz import quantize_frozen

KEYS = ("zero_quantized_weights", "zero_quantized_nontrainable_weights",
        "zero_quantized_gradients", "zero_hpz_partition_size")


def _asked(zero_config):
    return [k for k in KEYS if (getattr(zero_config, k) > 1 if k == "zero_hpz_partition_size"
                                else getattr(zero_config, k))]


def check_zeropp(zero_config, world_size):
    """The refusals (before anything is partitioned)."""
    asked = _asked(zero_config)
    if not asked:
        return
    stage = int(zero_config.stage)
    if stage != 3:
        raise ValueError(f"zero_optimization: {', '.join(asked)} (ZeRO++ / MixZ++) work on ZeRO-3 "
                         f"parameter partitions; set zero_optimization.stage to 3 (it is {stage})")
    if zero_config.mics_shard_size > 0:
        raise ValueError(f"zero_optimization: {', '.join(asked)} cannot be combined with "
                         f"mics_shard_size={zero_config.mics_shard_size}: MiCS replaces the same "
                         f"gather and reduce collectives with its shard groups; use one or the "
                         f"other")
    hpz = int(zero_config.zero_hpz_partition_size)
    if hpz > 1 and (hpz > world_size or world_size % hpz):
        raise ValueError(f"zero_optimization.zero_hpz_partition_size={hpz} must divide the "
                         f"data-parallel world size {world_size} (set it to the GPUs per node)")
    if zero_config.zero_quantized_gradients and not zero_config.reduce_scatter:
        raise ValueError("zero_optimization.zero_quantized_gradients replaces the gradient "
                         "reduce-scatter, but reduce_scatter is false (all-reduce): set "
                         "reduce_scatter: true or drop zero_quantized_gradients")
    if zero_config.zero_quantized_nontrainable_weights and \
            zero_config.offload_param_device.value == "nvme":
        raise ValueError("zero_optimization.zero_quantized_nontrainable_weights keeps frozen "
                         "shards quantized in memory; it cannot be combined with "
                         "offload_param.device 'nvme' (use 'cpu' or none)")


def setup_zeropp(engine, zero_config, partitioners, params):
    """Install ZeRO++ on the model's partitioners; None when no ZeRO++ key is on."""
    if not zeropp_requested(zero_config):
        return None
    world = dist.get_world_size(group=engine.dp_group)
    check_zeropp(zero_config, world)
    for partitioner in partitioners:
        if partitioner.world_size != world:
            raise ValueError(f"ZeRO++ needs every parameter partitioned over the data-parallel "
                             f"group ({world} ranks); some were partitioned over "
                             f"{partitioner.world_size} (zero.Init with another group)")
    comm = ZeroPPComm(engine.dp_group, world,
                      quantized_weights=bool(zero_config.zero_quantized_weights),
                      hpz_size=int(zero_config.zero_hpz_partition_size),
                      quantized_gradients=bool(zero_config.zero_quantized_gradients),
                      quantized_frozen=bool(zero_config.zero_quantized_nontrainable_weights))
    for partitioner in partitioners:
        comm.install(partitioner)
    if comm.quantized_frozen:
        count = quantize_frozen(params)
        logger.info(f"MixZ++: {count} frozen parameter shard(s) stored as int8")
    if comm.hpz is not None:
        extra = comm.hpz.extra_bytes(params)
        logger.info(f"hpZ: secondary partition over {comm.hpz.size} ranks per node costs "
                    f"{extra / 2**20:.2f} MiB per rank")
    return comm


def attach_to_optimizer(optimizer, comm, module):
    """The reducer's reduce-scatter becomes the comm's (qgZ), and the optimizer gains
    ``quantize_nontrainable_params`` (the MixZ++ tutorial calls it after applying LoRA)."""
    optimizer.reducer.reduce_scatter = comm.reduce_scatter

    def quantize_nontrainable_params(self):
        """Store the frozen weights' shards as int8 (MixZ++); returns how many were quantized."""
        if not comm.quantized_frozen:
            raise ValueError("quantize_nontrainable_params() needs zero_optimization."
                             "zero_quantized_nontrainable_weights: true")
        return quantize_frozen(list(module.parameters()))

    optimizer.quantize_nontrainable_params = types.MethodType(quantize_nontrainable_params,
                                                              optimizer)
