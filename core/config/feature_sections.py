"""Top-level config keys the DeepSpeed docs document for *features*, which plugins own.

The core validates these only through the model a plugin contributes. The table exists so that a
documented key whose plugin is missing gets "no installed plugin provides it" instead of a
misleading "unknown key, did you mean ...": the user's config is right, their install is not.
"""
from typing import Dict

# key -> the feature (as the docs name it) that the section configures
FEATURE_SECTIONS: Dict[str, str] = {
    "zero_optimization": "ZeRO (Zero Redundancy Optimizer)",
    "zero_allow_untested_optimizer": "ZeRO with an optimizer outside its tested list",
    "zero_force_ds_cpu_optimizer": "ZeRO-Offload's choice of CPU optimizer",
    "aio": "asynchronous I/O for NVMe offload (DeepNVMe / ZeRO-Infinity)",
    "tensorboard": "monitoring to TensorBoard",
    "wandb": "monitoring to Weights & Biases",
    "csv_monitor": "monitoring to CSV files",
    "comet": "monitoring to Comet",
    "comms_logger": "communication logging",
    "flops_profiler": "the flops profiler",
    "autotuning": "autotuning",
    "pipeline": "pipeline parallelism",
    "compression_training": "the model compression library",
    "data_efficiency": "the data efficiency library (curriculum learning, random-LTD)",
    "curriculum_learning": "legacy curriculum learning",
    "sparse_attention": "sparse attention",
    "elasticity": "elastic training",
    "progressive_layer_drop": "progressive layer dropping",
    "quantize_training": "mixture-of-quantization (MoQ)",
    "sequence_parallel_size": "Ulysses sequence parallelism",
    "tensor_parallel": "AutoTP tensor-parallel training",
}

#: the section of the plugin that answers ``deepspeed.tp_model_init``
#: (``deepspeed_tp_model_init``); named when no installed plugin does
TP_MODEL_INIT_SECTION = "tensor_parallel"


def missing_plugin_problem(key: str) -> str:
    feature = FEATURE_SECTIONS[key]
    return (f"'{key}' is a DeepSpeed config section, but no installed plugin provides it "
            f"(it configures {feature}); install/enable that plugin or remove the section")
