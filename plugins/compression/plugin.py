"""The ``compression`` plugin: owns ``compression_training`` and ``quantize_training`` (MoQ).

The engine takes part when either section is enabled or when the model holds layers that
``init_compression`` made compression-aware (``deepspeed_enable_for_model``), so a model
prepared for compression has its schedule advanced even if the engine's config omits the
section. After every optimizer step (``deepspeed_after_step``) the compression schedule moves to
``engine.global_steps`` and MoQ quantizes the weights. Checkpoints keep the step-dependent
state (which techniques are on, the bits, MoQ's period): the plugin is the ``Stateful`` it hands
the engine under ``ds_compression`` (``deepspeed_stateful``).
"""
import sys

from deepspeed.hooks import hookimpl
from deepspeed.plugin_manager import DeepSpeedPlugin
from deepspeed.utils.logging import log_dist

from .config import CompressionTrainingConfig, QuantizeTrainingConfig

STATE_KEY = "ds_compression"  # its name in checkpoints (top level of the file before Stateful)


class CompressionPlugin(DeepSpeedPlugin):
    config_sections = {"compression_training": CompressionTrainingConfig,
                       "quantize_training": QuantizeTrainingConfig}

    def __init__(self):
        self.scheduler = None
        self.moq = None
        self.eigen_layers = []  # eigenvalue MoQ's [(name, layer)]

    @hookimpl
    def deepspeed_enable_for_model(self, model):
        # compression-aware layers come from ``basic_layer``: while nothing imported it, no model
        # holds one, and a run without compression imports none of the library (the catalog
        # asks this of every model: see ``deepspeed.utils.lazy_exports``)
        if "deepspeed.compression.basic_layer" not in sys.modules:
            return None
        from .scheduler import compressed_layers

        return bool(compressed_layers(model)) or None

    @hookimpl
    def deepspeed_engine_init(self, engine, config):
        from .moq import MoQQuantizer
        from .scheduler import compression_scheduler

        self.scheduler = compression_scheduler(engine.module)
        section = config.section("compression_training")
        if section is not None and section.enabled and not self.scheduler.layers \
                and _needs_layers(section):
            log_dist("compression_training is enabled but the model holds no compression-aware "
                     "layer: call deepspeed.compression.compress.init_compression(model, config) "
                     "before deepspeed.initialize", ranks=[0], level=30)
        moq = config.section("quantize_training")
        if moq is not None and moq.enabled:
            layers = []
            if moq.eigenvalue.enabled:
                from .eigenvalue import sensitive_layers

                if engine.sharding.stage == 3:
                    raise ValueError("quantize_training.eigenvalue needs each layer's whole "
                                     "parameters for its Hessian-vector products; ZeRO stage 3 "
                                     "partitions them: use ZeRO stage 0-2 or disable eigenvalue")

                layers = sensitive_layers(engine.module, moq.eigenvalue)
            self.eigen_layers = layers
            self.moq = MoQQuantizer(moq, [name for name, _ in layers])

    @hookimpl
    def deepspeed_engine_attributes(self):
        """Upstream's engine members for compression and MoQ."""
        return {"compression_scheduler": self.scheduler, "quantizer": self.moq,
                "quantize_bits": lambda: self.moq.bits if self.moq else None}

    @hookimpl
    def deepspeed_before_backward(self, engine, loss):
        """Eigenvalue MoQ: at every ``gas_boundary_resolution``-th accumulation boundary, the
        layers' Hessian eigenvalues (averaged over the data-parallel ranks, so every replica
        follows the same schedule) set their period factors; the loss keeps its graph."""
        if not self.eigen_layers or not engine.is_gradient_accumulation_boundary():
            return
        config = self.moq.config.eigenvalue
        if engine.global_steps % config.gas_boundary_resolution:
            return
        from .eigenvalue import layer_eigenvalues, period_factors

        eigenvalues = layer_eigenvalues(loss, self.eigen_layers, config)
        if engine.dp_world_size > 1:
            import torch

            from deepspeed import comm as dist

            values = torch.tensor(list(eigenvalues.values()), dtype=torch.float64,
                                  device=loss.device)
            dist.all_reduce(values, group=engine.dp_group)
            eigenvalues = dict(zip(eigenvalues, (values / engine.dp_world_size).tolist()))
        self.moq.set_eigenvalues(period_factors(eigenvalues))
        if config.verbose:
            log_dist(f"MoQ eigenvalues at step {engine.global_steps}: {eigenvalues}, period "
                     f"factors {self.moq.factors}", ranks=[0])
        if engine.monitor is not None:
            engine.monitor.write_events([(f"Train/Eigenvalues/ModelBlockParam_{idx}", value,
                                          engine.global_samples)
                                         for idx, value in enumerate(eigenvalues.values())])

    @hookimpl
    def deepspeed_after_step(self, engine):
        step = engine.global_steps
        if self.scheduler is not None:
            self.scheduler.step(step)
        if self.moq is not None:
            self.moq.step(engine.module, step)
            if self.moq.config.quantize_verbose:
                log_dist(f"MoQ step {step}: {self.moq.bits} bits, period {self.moq.period}",
                         ranks=[0])

    # ------------------------------------------------------------------ checkpoints
    @hookimpl
    def deepspeed_stateful(self):
        return {STATE_KEY: self}

    def state_dict(self):
        saved = {}
        if self.moq is not None:
            saved["moq"] = self.moq.state_dict()
        if self.scheduler is not None:
            saved["steps"] = self.scheduler.training_steps
        return saved

    def load_state_dict(self, saved):
        if self.moq is not None and "moq" in saved:
            self.moq.load_state_dict(saved["moq"])
        if self.scheduler is not None and "steps" in saved:
            for layer in self.scheduler.layers:
                layer.update_schedule(int(saved["steps"]))
            self.scheduler.training_steps = int(saved["steps"])


def _needs_layers(section):
    from .config import TECHNIQUES
    return any(getattr(section, name).shared_parameters.enabled for name in TECHNIQUES)
