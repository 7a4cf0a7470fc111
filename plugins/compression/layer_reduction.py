"""Layer reduction: a shallower student initialised from chosen layers of its teacher.

The student (built with ``keep_number_layer`` layers) gets teacher layer ``teacher_layer[i]``
as its layer ``i``, and the modules in ``other_module_name`` (embeddings, pooler, classifier)
copied whole, so distillation starts from the teacher's knowledge instead of from scratch.
"""
from .matching import get_module


def student_initialization(student, teacher, config):
    """Copy the teacher's weights into ``student`` as ``config`` (a ``LayerReductionConfig``)
    says. Shapes must agree layer for layer; a mismatch names the module."""
    prefix = config.module_name_prefix
    student_layers = _layers(student, prefix, "student")
    teacher_layers = _layers(teacher, prefix, "teacher_model")
    if len(student_layers) != config.keep_number_layer:
        raise ValueError(f"compression_training.layer_reduction.keep_number_layer is "
                         f"{config.keep_number_layer} but the student's {prefix} holds "
                         f"{len(student_layers)} layers: build the student with "
                         f"num_hidden_layers = keep_number_layer")
    for index in config.teacher_layer:
        if not 0 <= index < len(teacher_layers):
            raise ValueError(f"compression_training.layer_reduction.teacher_layer names layer "
                             f"{index}, but the teacher's {prefix} has {len(teacher_layers)}")
    for student_index, teacher_index in enumerate(config.teacher_layer):
        _copy(student_layers[student_index], teacher_layers[teacher_index],
              f"{prefix}.{student_index} <- teacher {prefix}.{teacher_index}")
    for name in config.other_module_name:
        _copy(get_module(student, name), get_module(teacher, name), name)
    return student


def _layers(model, prefix, who):
    try:
        return get_module(model, prefix)
    except (AttributeError, IndexError) as exc:
        raise ValueError(f"compression_training.layer_reduction.module_name_prefix {prefix!r} "
                         f"names no module of the {who}") from exc


def _copy(student_module, teacher_module, where):
    try:
        student_module.load_state_dict(teacher_module.state_dict())
    except RuntimeError as exc:
        raise ValueError(f"layer reduction cannot copy {where}: {exc}") from exc
