"""The ``onebit`` plugin: 1-bit Adam, 0/1 Adam and 1-bit LAMB in the engine.

Enabled by the config's ``optimizer.type`` (``OneBitAdam`` / ``OnebitAdam``, ``ZeroOneAdam``,
``OneBitLamb`` / ``OnebitLamb``, any case). Through the hooks it

- builds the optimizer the core does not know (``deepspeed_build_optimizer``), handing it the
  engine so it compresses over the engine's data-parallel group;
- takes the gradient reduction over whenever the optimizer says the step needs no
  full-precision all-reduce (``deepspeed_reduce_gradients`` returns True and nothing is sent:
  the momentum exchange inside the optimizer's step replaces it);
- resets the compression errors (and 0/1 Adam's local-step buffers) on every checkpoint load,
  also one that skips the optimizer states, since the parameters changed under them.

It excludes ``zero`` (stages 1-3 partition the optimizer state the 1-bit exchange needs whole:
upstream asserts the same) and ``moe`` (expert gradients are averaged over expert groups, which
the compressed exchange over the data-parallel group would get wrong). The MPI backend cannot
serve a pipeline (its data-parallel group is not MPI's world): refused naming ``pipe``.
"""
import importlib
import sys

from deepspeed.hooks import hookimpl
from deepspeed.onebit.names import (ONEBIT_ADAM_OPTIMIZER, ONEBIT_LAMB_OPTIMIZER,
                                    ZERO_ONE_ADAM_OPTIMIZER)
from deepspeed.plugin_manager import DeepSpeedPlugin, PluginError
from deepspeed.utils.logging import log_dist

# config name (lower case) -> (module, class); imported only when the config asks for one, since
# the catalog loads this plugin with every run (``deepspeed.utils.lazy_exports``)
OPTIMIZERS = {ONEBIT_ADAM_OPTIMIZER: ("deepspeed.onebit.adam", "OnebitAdam"),
              ZERO_ONE_ADAM_OPTIMIZER: ("deepspeed.onebit.zoadam", "ZeroOneAdam"),
              ONEBIT_LAMB_OPTIMIZER: ("deepspeed.onebit.lamb", "OnebitLamb")}


def _onebit_optimizer(engine):
    base = sys.modules.get("deepspeed.onebit.base")  # not imported: no 1-bit optimizer exists
    optimizer = engine.basic_optimizer
    return optimizer if base is not None and isinstance(optimizer, base.OneBitOptimizer) else None


class OneBitPlugin(DeepSpeedPlugin):
    config_sections = {}
    enabled_by = "optimizer.type OneBitAdam, ZeroOneAdam or OneBitLamb"
    excludes = ("zero", "moe")

    def is_enabled(self, config, sections):
        return (config.optimizer_name or "").lower() in OPTIMIZERS

    @hookimpl
    def deepspeed_build_optimizer(self, engine, name, params, optimizer_params):
        where = OPTIMIZERS.get(name.lower())
        if where is None:
            return None
        from deepspeed.onebit.transports import MPI_BACKEND
        from deepspeed.optimizers import construct

        cls = getattr(importlib.import_module(where[0]), where[1])
        options = dict(optimizer_params or {})
        if "deepspeed" in options:
            raise ValueError("optimizer.params.deepspeed: the engine is passed by deepspeed."
                             "initialize itself; remove the key")
        backend = str(options.get("comm_backend_name", "nccl")).lower()
        if backend == MPI_BACKEND and engine.plugins.has_plugin("pipe"):
            raise PluginError("plugin 'onebit' with comm_backend_name 'mpi' cannot be used "
                              "together with plugin 'pipe' (MPI compresses over the whole world, "
                              "a pipeline's data-parallel groups are smaller); use "
                              "comm_backend_name 'compressed' or 'nccl'")
        if not engine.config.fp16_enabled:
            log_dist(f"{cls.__name__}: convergence is documented as verified with fp16 only; "
                     f"this run uses {'bf16' if engine.config.bfloat16_enabled else 'fp32'}",
                     ranks=[0], level=30)
        return construct(cls, params, dict(options, deepspeed=engine))

    @hookimpl
    def deepspeed_reduce_gradients(self, engine):
        optimizer = _onebit_optimizer(engine)
        if optimizer is not None and not optimizer.enable_backward_allreduce:
            return True  # the optimizer's step exchanges compressed momenta instead
        return None

    @hookimpl
    def deepspeed_load_checkpoint(self, engine):
        optimizer = _onebit_optimizer(engine)
        if optimizer is not None:
            optimizer.reset_after_load()
