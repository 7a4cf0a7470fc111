"""Op builders (`deepspeed.ops.op_builder`): how each native op is compiled and loaded.

The per-op builder modules are imported lazily (module `__getattr__`) so that importing this
package never compiles or imports torch's extension machinery, and one broken builder module
cannot hide the others.
"""
import importlib

from deepspeed.ops.op_builder.builder import (CSRC_ROOT, CUDAOpBuilder, OpBuildError, OpBuilder,
                                              cpu_simd_flags, get_op_builder)

# class name -> module (inside this package) that defines it; mirrors the entry points in
# pyproject.toml, which are what discovery actually uses.
BUILDER_MODULES = {
    "CPUAdamBuilder": "cpu_adam",
    "CPUAdagradBuilder": "cpu_adagrad",
    "CPULionBuilder": "cpu_lion",
    "AsyncIOBuilder": "async_io",
    "GDSBuilder": "gds",
    "FusedAdamBuilder": "fused_adam",
    "FusedLambBuilder": "fused_lamb",
    "SparseAttnBuilder": "sparse_attn",
    "TransformerBuilder": "triton_op",
    "EvoformerAttnBuilder": "triton_op",
    "StochasticTransformerBuilder": "triton_op",
    "TransformerInferenceBuilder": "triton_op",
    "QuantizerBuilder": "triton_op",
    "FusedLionBuilder": "fused_lion",
    "CCLCommBuilder": "unavailable",
    "RandomLTDBuilder": "unavailable",
}


def __getattr__(name):
    module_name = BUILDER_MODULES.get(name)
    if module_name is None:
        # a builder module itself (`deepspeed.ops.op_builder.cpu_adam`), as after upstream's
        # `import deepspeed`
        from deepspeed.utils.lazy_exports import import_submodule

        submodule = import_submodule(__name__, name)
        if submodule is None:
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
        return submodule
    full_name = f"{__name__}.{module_name}"
    try:
        module = importlib.import_module(full_name)
    except ModuleNotFoundError as err:
        if err.name != full_name:
            raise  # the builder module exists but imports something missing: a real bug
        raise AttributeError(f"op builder {name!r} is not part of this installation "
                             f"(no module {full_name!r})") from err
    return getattr(module, name)


# the per-op builders are deliberately not in __all__: a star import must not import them all
__all__ = ["CSRC_ROOT", "CUDAOpBuilder", "OpBuildError", "OpBuilder", "cpu_simd_flags", "get_op_builder"]
