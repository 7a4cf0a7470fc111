"""Native and fallback ops (`deepspeed.ops`); builders live in `deepspeed.ops.op_builder`.

``__compatible_ops__`` (``{op name: bool}``, upstream's name) says which ops this machine can
build: ``deepspeed.git_version_info.compatible_ops``, computed on first access."""


def __getattr__(name):
    if name == "__compatible_ops__":
        from deepspeed.git_version_info import compatible_ops

        globals()[name] = compatible_ops
        return compatible_ops
    raise AttributeError(f"module '{__name__}' has no attribute '{name}'")
