"""``init_compression`` and ``redundancy_clean``: DeepSpeed's compression entry points.

``init_compression(model, deepspeed_config, teacher_model=None, mpu=None)`` reads the
``compression_training`` section, initialises a reduced student from its teacher (layer
reduction), swaps every layer a technique's ``modules`` patterns name for its compression-aware
twin (``basic_layer``) and applies step 0 of the schedule. Train it with the engine (which
advances the schedule) or by hand with ``compression_scheduler``.

``redundancy_clean(model, deepspeed_config, mpu=None)`` bakes masks and quantization into plain
torch layers and physically removes pruned rows, heads and channels (see ``clean``).
"""
from deepspeed.config import DeepSpeedConfigError, load_config_source
from deepspeed.config.validation import validate_config
from deepspeed.utils.logging import logger

from .basic_layer import SUPPORTED, CompressionState, compress_class_for
from .config import TECHNIQUES, CompressionTrainingConfig, DenseRatioParams, PruneGroup
from .layer_reduction import student_initialization as _student_initialization
from .matching import get_module, match_modules, related_for, set_module
from .scheduler import apply_step, compressed_layers

SECTION = "compression_training"
SNIP_DEFAULT_GROUP = PruneGroup(modules=["*"])


def compression_config(deepspeed_config):
    """The validated ``compression_training`` section of a config dict or file path."""
    raw = load_config_source(deepspeed_config)
    if SECTION not in raw:
        raise DeepSpeedConfigError(f"the config has no '{SECTION}' section: init_compression "
                                   f"and redundancy_clean need it")
    _, sections = validate_config({SECTION: raw[SECTION]}, {SECTION: CompressionTrainingConfig})
    return sections[SECTION]


def _accept(technique):
    kinds = SUPPORTED[technique]

    def accept(module):
        cls = compress_class_for(module)
        return cls is not None and cls.kind in kinds
    return accept


def _settings(technique, shared, params):
    settings = {"schedule_offset": shared.schedule_offset}
    if technique == "weight_quantization":
        settings.update(start_bits=params.start_bits, target_bits=params.target_bits,
                        quantization_period=params.quantization_period,
                        num_groups=shared.quantize_groups,
                        quantization_type=shared.quantization_type, rounding=shared.rounding,
                        in_forward=shared.quantize_weight_in_forward)
    elif technique == "activation_quantization":
        settings.update(bits=params.bits, quantization_type=shared.quantization_type,
                        range_calibration=shared.range_calibration)
    elif technique == "sparse_pruning" and shared.method == "snip_momentum":
        settings.update(method=shared.method, dense_ratio=shared.dense_ratio,
                        block_pattern=shared.block_pattern,
                        schedule_offset_end=shared.schedule_offset_end,
                        stride=shared.schedule_offset_stride)
    else:
        settings.update(method=shared.method, dense_ratio=params.dense_ratio)
        if technique == "head_pruning":
            settings["num_heads"] = shared.num_heads
    return settings


def _to_compressed(model, name):
    module = get_module(model, name)
    if isinstance(module, CompressionState):
        return module
    new = compress_class_for(module).from_module(module)
    set_module(model, name, new)
    return new


def _pair_related(group, where):
    """(module pattern, its related patterns): ``related_modules[i]`` belongs to
    ``modules[i]``; a single list applies to every pattern."""
    related = group.related_modules or []
    if len(related) not in (0, 1, len(group.modules)):
        raise ValueError(f"{where}.related_modules has {len(related)} lists for "
                         f"{len(group.modules)} module patterns: give one list per pattern "
                         f"of 'modules' (or a single list for all)")
    for index, pattern in enumerate(group.modules):
        yield pattern, (related[index] if len(related) > 1 else related[0] if related else [])


def init_compression(model, deepspeed_config, teacher_model=None, mpu=None):
    """Prepare ``model`` for compression training as the config's ``compression_training``
    section says; returns the model (changed in place). ``mpu`` is accepted for DeepSpeed's
    signature; tensor-parallel layers are not supported here."""
    config = compression_config(deepspeed_config)
    if config.layer_reduction.enabled:
        if teacher_model is None:
            raise ValueError("compression_training.layer_reduction is enabled, which initialises "
                             "the student from a teacher: pass init_compression(..., "
                             "teacher_model=<the full model>)")
        _student_initialization(model, teacher_model, config.layer_reduction)
    for technique in TECHNIQUES:
        section = getattr(config, technique)
        shared = section.shared_parameters
        if not shared.enabled:
            continue
        groups = section.different_groups
        if technique == "sparse_pruning" and shared.method == "snip_momentum" and not groups:
            # documented: snip_momentum needs no groups; the global dense_ratio applies to all
            groups = {"default": SNIP_DEFAULT_GROUP.model_copy(
                update={"params": DenseRatioParams(dense_ratio=shared.dense_ratio)})}
        if not groups:
            raise ValueError(f"compression_training.{technique} is enabled but "
                             f"different_groups is empty: name at least one group with its "
                             f"params and modules")
        excluded = getattr(shared, "excluded_modules", ())
        for group_name, group in groups.items():
            where = f"compression_training.{technique}.different_groups.{group_name}"
            settings = _settings(technique, shared, group.params)
            for pattern, related_patterns in _pair_related(group, where):
                for name in match_modules(model, [pattern], _accept(technique), where, excluded):
                    related = related_for(model, name, related_patterns, _related_accept, where)
                    _to_compressed(model, name).add_technique(technique, related=related,
                                                              **settings)
    for layer in compressed_layers(model):
        apply_step(layer, 0)
    logger.info(f"init_compression: {len(compressed_layers(model))} compression-aware layers")
    return model


def student_initialization(student_model, teacher_model, deepspeed_config):
    """DeepSpeed's standalone layer-reduction initialiser: copy the ``teacher_layer`` layers and
    ``other_module_name`` modules of ``teacher_model`` into ``student_model``."""
    config = compression_config(deepspeed_config).layer_reduction
    return _student_initialization(student_model, teacher_model, config)


def _related_accept(module):
    import torch
    return isinstance(module, (torch.nn.Linear, torch.nn.Conv2d, torch.nn.BatchNorm2d))


def redundancy_clean(model, deepspeed_config, mpu=None):
    """Bake every technique into plain torch layers and drop pruned structure; returns the model
    (changed in place). Its outputs equal the masked model's (up to float rounding), except
    channel pruning in front of a BatchNorm, whose shift the pruned channels no longer carry."""
    from .clean import clean_model

    compression_config(deepspeed_config)  # the same config: its errors surface here too
    return clean_model(model)
