"""Native and fallback ops (`deepspeed.ops`); builders live in `deepspeed.ops.op_builder`.

``__compatible_ops__`` (``{op name: bool}``, upstream's name) says which ops this machine can
build: ``deepspeed.git_version_info.compatible_ops``, computed on first access. Submodules load
on first attribute access (`deepspeed.ops.adam` after a plain `import deepspeed`)."""
from deepspeed.utils.lazy_exports import lazy_exports

_submodule, __dir__ = lazy_exports(__name__)


def __getattr__(name):
    if name == "__compatible_ops__":
        from deepspeed.git_version_info import compatible_ops

        globals()[name] = compatible_ops
        return compatible_ops
    return _submodule(name)
