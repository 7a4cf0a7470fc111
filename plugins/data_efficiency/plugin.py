"""The ``data_efficiency`` plugin: curriculum learning (legacy seqlen and data sampling),
random-LTD and progressive layer drop, as the DeepSpeed engine offers them.

It owns three config sections (``data_efficiency``, ``curriculum_learning``,
``progressive_layer_drop``) and adds upstream's engine methods to the engines it takes part in
(``set_custom_curriculum_learning_schedule``, ``set_data_post_process_func``,
``get_pld_theta``, ``random_ltd_initialize`` ...). Per step:

- training forward: the legacy curriculum advances to step ``global_steps + 1`` and the model
  gets ``curriculum_seqlen`` (or a truncated batch); PLD adds its keywords; random-LTD's
  scheduler sets this step's kept length and counts its layer tokens;
- after each optimizer step: PLD's θ advances to ``global_steps``;
- the training loader is a ``CurriculumDataLoader`` when data sampling is on;
- checkpoints keep every scheduler's state and the loader's position: the plugin is the
  ``Stateful`` it hands the engine under ``ds_data_efficiency`` (``deepspeed_stateful``).
"""
from deepspeed.hooks import hookimpl
from deepspeed.plugin_manager import DeepSpeedPlugin
from deepspeed.utils.lazy_module import lazy_module
from deepspeed.utils.logging import log_dist

from .config import CurriculumLearningLegacyConfig, DataEfficiencyConfig, \
    ProgressiveLayerDropConfig
from .curriculum_scheduler import CurriculumScheduler
from .engine_inputs import accepts_keyword, truncate
from .progressive_layer_drop import ProgressiveLayerDrop

dist = lazy_module("deepspeed.comm")  # loaded on first use (the launcher imports this plugin without torch)

STATE_KEY = "ds_data_efficiency"  # its name in checkpoints (top level of the file before Stateful)


class DataEfficiencyPlugin(DeepSpeedPlugin):
    config_sections = {"data_efficiency": DataEfficiencyConfig,
                       "curriculum_learning": CurriculumLearningLegacyConfig,
                       "progressive_layer_drop": ProgressiveLayerDropConfig}

    def __init__(self):
        self.data_efficiency = None
        self.legacy = None  # CurriculumScheduler of the legacy section
        self.legacy_as_keyword = True
        self.pld = None
        self.random_ltd = None  # RandomLTDScheduler
        self.layer_token_lr = None  # the layer_token_lr_schedule section when enabled
        self.peak_lrs = None  # its peak: each param group's learning rate at the first step
        self.loader = None  # CurriculumDataLoader
        self.custom_schedules = {}
        self.post_process_func = None

    # ------------------------------------------------------------------ set-up
    @hookimpl
    def deepspeed_engine_init(self, engine, config):
        de = config.section("data_efficiency")
        self.data_efficiency = de if de is not None and de.enabled else None
        legacy = config.section("curriculum_learning")
        if legacy is not None and legacy.enabled:
            self.legacy = CurriculumScheduler(legacy.model_dump(), where="curriculum_learning")
            self.legacy_as_keyword = accepts_keyword(engine.module, "curriculum_seqlen")
        pld = config.section("progressive_layer_drop")
        if pld is not None and pld.enabled:
            for name in ("progressive_layer_drop", "pld_theta"):
                if not accepts_keyword(engine.module, name):
                    raise TypeError(f"progressive_layer_drop is enabled, but "
                                    f"{type(engine.module).__name__}.forward takes no '{name}' "
                                    f"keyword; the engine passes progressive_layer_drop=True, "
                                    f"pld_theta=<theta> in training forwards")
            self.pld = ProgressiveLayerDrop(theta=pld.theta, gamma=pld.gamma)
            log_dist(f"Enabled progressive layer dropping (theta = {pld.theta})", ranks=[0])
        if self.data_efficiency is not None and self.data_efficiency.random_ltd_enabled():
            from .random_ltd import RandomLTDScheduler

            ltd = self.data_efficiency.data_routing.random_ltd
            self.random_ltd = RandomLTDScheduler(ltd, global_batch_size=engine.train_batch_size(),
                                                 seed=self.data_efficiency.seed)
            if ltd.layer_token_lr_schedule.enabled:
                self.layer_token_lr = ltd.layer_token_lr_schedule

    @hookimpl
    def deepspeed_engine_attributes(self, engine):
        """Upstream's engine members for these features."""
        return {
            "set_custom_curriculum_learning_schedule": self.set_custom_schedule,
            "set_data_post_process_func": self.set_post_process,
            "get_pld_theta": lambda: self.pld.get_theta() if self.pld else None,
            "curriculum_enabled_legacy": lambda: self.legacy is not None,
            "random_ltd_enabled": lambda: self.random_ltd is not None,
            "data_sampling_enabled": lambda: (self.data_efficiency is not None and
                                              self.data_efficiency.sampling_enabled()),
            "random_ltd_initialize": lambda: self.random_ltd_initialize(engine),
            "curriculum_scheduler_legacy": self.legacy,
            "progressive_layer_drop": self.pld,
            "random_ltd_scheduler": self.random_ltd,
        }

    def set_custom_schedule(self, schedule):
        """A callable sets the legacy curriculum's schedule; a dict ``{metric: callable}`` the
        data-sampling metrics' (upstream takes the dict)."""
        if callable(schedule):
            if self.legacy is None:
                raise ValueError("set_custom_curriculum_learning_schedule got one function, "
                                 "which sets the legacy curriculum_learning schedule, but that "
                                 "section is not enabled; pass {metric_name: function} for "
                                 "data_efficiency curriculum metrics")
            self.legacy.set_custom_get_difficulty(schedule)
            return
        if not isinstance(schedule, dict):
            raise TypeError(f"set_custom_curriculum_learning_schedule takes a function or a dict "
                            f"{{metric_name: function}}, got {type(schedule).__name__}")
        if self.legacy is not None and "seqlen" in schedule and len(schedule) == 1 \
                and self.loader is None:
            self.legacy.set_custom_get_difficulty(schedule["seqlen"])
            return
        self.custom_schedules.update(schedule)
        if self.loader is not None:
            self.loader.data_sampler.set_custom_curriculum_learning_schedule(schedule)

    def set_post_process(self, fn):
        if fn is not None and not callable(fn):
            raise TypeError(f"set_data_post_process_func needs a callable (batch, "
                            f"sampler_state) -> batch, got {type(fn).__name__}")
        self.post_process_func = fn
        if self.loader is not None:
            self.loader.post_process_func = fn

    def random_ltd_initialize(self, engine):
        from .random_ltd.helper import random_ltd_layers

        if self.random_ltd is None:
            raise ValueError("convert_to_random_ltd(engine, ...) needs "
                             "data_efficiency.enabled, data_routing.enabled and "
                             "data_routing.random_ltd.enabled in the config")
        layers = random_ltd_layers(engine.module)
        config = self.random_ltd.config
        if len(layers) != config.total_layer_num:
            raise ValueError(f"data_efficiency.data_routing.random_ltd.total_layer_num is "
                             f"{config.total_layer_num} but convert_to_random_ltd wrapped "
                             f"{len(layers)} layers")
        for index, layer in enumerate(layers):
            layer.init_config(config, self.random_ltd, index)

    # ------------------------------------------------------------------ data loader
    @hookimpl
    def deepspeed_data_loader(self, engine, dataset, batch_size, route, collate_fn,
                              num_local_io_workers):
        if route not in (None, "train") or self.data_efficiency is None \
                or not self.data_efficiency.sampling_enabled():
            return None
        from .data_analyzer import dataset_length
        from .data_loader import CurriculumDataLoader
        from .data_sampler import DeepSpeedDataSampler

        sampling = self.data_efficiency.data_sampling
        sampler = DeepSpeedDataSampler(
            self.data_efficiency, dataset_length(dataset, "curriculum data sampling"),
            micro_batch_size=batch_size,
            data_parallel_rank=dist.get_rank(group=engine.dp_group),
            data_parallel_size=engine.dp_world_size, data_parallel_group=engine.dp_group,
            gradient_accumulation_steps=engine.gradient_accumulation_steps(),
            global_rank=dist.get_rank(), drop_last=True)
        if self.custom_schedules:
            sampler.set_custom_curriculum_learning_schedule(self.custom_schedules)
        self.loader = CurriculumDataLoader(dataset, sampler, collate_fn=collate_fn,
                                           num_workers=num_local_io_workers or
                                           sampling.num_workers,
                                           pin_memory=sampling.pin_memory)
        self.loader.post_process_func = self.post_process_func
        return self.loader

    # ------------------------------------------------------------------ the step
    @hookimpl
    def deepspeed_before_forward(self, engine):
        if self.random_ltd is not None and engine.module.training:
            self.random_ltd.update_seq(engine.global_steps)

    @hookimpl
    def deepspeed_forward_inputs(self, engine, args, kwargs):
        if not engine.module.training or (self.legacy is None and self.pld is None):
            return None
        kwargs = dict(kwargs)
        if self.legacy is not None:
            seqlen = self.legacy.update_difficulty(engine.global_steps + 1)
            if self.legacy_as_keyword:
                kwargs["curriculum_seqlen"] = seqlen
            else:
                args, kwargs = truncate(args, seqlen), truncate(kwargs, seqlen)
        if self.pld is not None:
            kwargs.update(self.pld.get_state())
        return args, kwargs

    @hookimpl
    def deepspeed_before_step(self, engine):
        """layer_token_lr_schedule: the learning rate of this optimizer step from the layer
        tokens consumed so far (this step's included)."""
        if self.layer_token_lr is None:
            return
        from .random_ltd.scheduler import layer_token_lr_factor

        if self.peak_lrs is None:  # the optimizer is built after deepspeed_engine_init
            if engine.lr_scheduler is not None:
                raise ValueError("data_efficiency.data_routing.random_ltd."
                                 "layer_token_lr_schedule sets the learning rate from the "
                                 "consumed layer tokens; a step-based LR scheduler (the "
                                 "'scheduler' section or lr_scheduler=) would fight it: use "
                                 "one of them")
            self.peak_lrs = [group["lr"] for group in engine.basic_optimizer.param_groups]
        factor = layer_token_lr_factor(self.random_ltd.consumed_layer_tokens, self.layer_token_lr)
        for group, peak in zip(engine.basic_optimizer.param_groups, self.peak_lrs):
            group["lr"] = peak * factor

    @hookimpl
    def deepspeed_after_step(self, engine):
        if self.pld is not None:
            self.pld.update_state(engine.global_steps)

    # ------------------------------------------------------------------ checkpoints
    @hookimpl
    def deepspeed_stateful(self):
        return {STATE_KEY: self}

    def state_dict(self):
        saved = {}
        if self.legacy is not None:
            saved["curriculum_learning_legacy"] = self.legacy.get_state()
        if self.pld is not None:
            saved["pld_theta"] = self.pld.get_theta()
        if self.random_ltd is not None:
            saved["random_ltd"] = self.random_ltd.state_dict()
        if self.loader is not None:
            saved["data_loader"] = self.loader.state_dict()
        if self.peak_lrs is not None:  # the optimizer's lr is the scheduled one, not the peak
            saved["layer_token_peak_lrs"] = list(self.peak_lrs)
        return saved

    def load_state_dict(self, saved):
        if self.legacy is not None and "curriculum_learning_legacy" in saved:
            self.legacy.set_state(saved["curriculum_learning_legacy"])
        if self.pld is not None and "pld_theta" in saved:
            self.pld.current_theta = float(saved["pld_theta"])
        if self.random_ltd is not None and "random_ltd" in saved:
            self.random_ltd.load_state_dict(saved["random_ltd"])
        if self.loader is not None and "data_loader" in saved:
            self.loader.load_state_dict(saved["data_loader"])
        if self.layer_token_lr is not None and "layer_token_peak_lrs" in saved:
            self.peak_lrs = [float(lr) for lr in saved["layer_token_peak_lrs"]]
