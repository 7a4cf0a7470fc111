"""The user-facing entry points: ``deepspeed.initialize``, ``deepspeed.add_config_arguments``,
``deepspeed.tp_model_init`` and ``deepspeed.init_inference``.

``initialize`` is where the pieces meet: distributed start-up, the plugin catalog (whose
config sections complete the schema), config validation, the per-engine plugin manager of
the plugins the config enables, and the engine itself.
"""
import argparse

from deepspeed import comm as dist
from deepspeed.config import DeepSpeedConfig, DeepSpeedConfigError, load_config_source
from deepspeed.engine import DeepSpeedEngine
from deepspeed.plugin_manager import PluginCatalog


def add_config_arguments(parser):
    """Add ``--deepspeed`` / ``--deepspeed_config`` (and the deprecated ``--deepscale*``
    spellings) to the user's argparse parser; returns the same parser."""
    group = parser.add_argument_group("DeepSpeed", "DeepSpeed configurations")
    group.add_argument("--deepspeed", default=False, action="store_true",
                       help="Enable DeepSpeed (helper flag for user code, no impact on DeepSpeed backend)")
    group.add_argument("--deepspeed_config", default=None, type=str,
                       help="DeepSpeed json configuration file.")
    group.add_argument("--deepscale", default=False, action="store_true",
                       help=argparse.SUPPRESS)
    group.add_argument("--deepscale_config", default=None, type=str, help=argparse.SUPPRESS)
    return parser


def _config_source(args, config, config_params):
    """Pick the one config the caller meant; two different ones is an error, not a guess."""
    if config is None:
        config = config_params
    elif config_params is not None and config_params is not config and config_params != config:
        raise AssertionError("deepspeed.initialize got both 'config' and 'config_params' with "
                             "different values; pass only 'config'")
    from_args = None
    if args is not None:
        ds_cfg = getattr(args, "deepspeed_config", None)
        old_cfg = getattr(args, "deepscale_config", None)
        assert not (ds_cfg is not None and old_cfg is not None), \
            "Not sure how to proceed, we were given deepspeed configs in the deepspeed " \
            "arguments and deepscale arguments, please use only deepspeed_config"
        from_args = ds_cfg if ds_cfg is not None else old_cfg
    assert not (from_args is not None and config is not None), \
        "Not sure how to proceed, we were given deepspeed configs in the deepspeed arguments " \
        "and deepspeed.initialize() function call"
    source = config if config is not None else from_args
    if source is None:
        raise DeepSpeedConfigError(no_config_problem(args))
    return source


def no_config_problem(args) -> str:
    """What to do when ``deepspeed.initialize`` got no config at all: the three ways to pass
    one, the one the caller was closest to first."""
    ways = ("pass one to deepspeed.initialize(config=...) as a dict or the path of a JSON file, "
            "e.g. config={\"train_batch_size\": 8, \"optimizer\": {\"type\": \"Adam\", "
            "\"params\": {\"lr\": 1e-3}}}")
    if args is not None and hasattr(args, "deepspeed_config"):
        return ("no DeepSpeed config was given: args.deepspeed_config is None. Run the script "
                "with --deepspeed_config ds_config.json (the flag deepspeed.add_config_arguments "
                f"adds to your parser), or {ways}")
    return (f"no DeepSpeed config was given: {ways}; or parse --deepspeed_config with "
            f"deepspeed.add_config_arguments(parser) and pass args=parser.parse_args()")


def initialize(args=None, model=None, optimizer=None, model_parameters=None, training_data=None,
               lr_scheduler=None, distributed_port=29500, mpu=None, dist_init_required=None,
               collate_fn=None, config=None, config_params=None):
    """Wrap ``model`` in a ``DeepSpeedEngine``.

    Returns ``(engine, optimizer, training_dataloader, lr_scheduler)``: the optimizer is the one
    the engine steps (possibly wrapped by a plugin), the loader is None without
    ``training_data``, the scheduler None when neither passed nor configured.
    """
    assert model is not None, "deepspeed.initialize requires a model"
    source = _config_source(args, config, config_params)
    dist.init_distributed(distributed_port=distributed_port,
                          dist_init_required=dist_init_required)
    catalog = PluginCatalog()
    # e.g. the pipe plugin claims a PipelineModule (and lays it out by the pipeline section)
    choice, owner = catalog.engine_choice(model, load_config_source(source))
    engine_class = DeepSpeedEngine if choice is None else choice.engine_class
    if mpu is None and choice is not None:
        mpu = choice.mpu
    ds_config = DeepSpeedConfig(source, mpu, sections=catalog.sections, catalog=catalog)
    wanted = ([owner] if owner else []) + catalog.wanted_by(model)
    plugins = catalog.enabled_manager(ds_config, also=wanted)
    engine = engine_class(model, ds_config, plugins, optimizer=optimizer,
                          model_parameters=model_parameters, lr_scheduler=lr_scheduler,
                          mpu=mpu, training_data=training_data, collate_fn=collate_fn)
    return engine, engine.optimizer, engine.training_dataloader, engine.lr_scheduler


def tp_model_init(model, tp_size, dtype, config=None, **kwargs):
    """Split ``model``'s layers across ``tp_size`` tensor-parallel ranks for AutoTP training
    (Transformers calls it when the config sets ``tensor_parallel.autotp_size`` > 1); returns
    the model to pass to ``deepspeed.initialize``.

    ``tp_size`` 1 is no tensor parallelism: the model comes back unchanged. Larger sizes go to
    the plugin owning the ``tensor_parallel`` section (``deepspeed_tp_model_init``; the core
    never imports it); without one installed the call fails with the same message a config
    naming that section gets, rather than an ``AttributeError`` deep inside Transformers.
    """
    from deepspeed.config.errors import DeepSpeedConfigError
    from deepspeed.config.feature_sections import TP_MODEL_INIT_SECTION, missing_plugin_problem
    from deepspeed.utils.arg_checks import check_int

    if check_int("tp_size", tp_size, 1) == 1:
        return model
    split = PluginCatalog().installed_hook.deepspeed_tp_model_init(
        model=model, tp_size=tp_size, dtype=dtype, config=config, kwargs=dict(kwargs))
    if split is None:
        raise DeepSpeedConfigError(missing_plugin_problem(TP_MODEL_INIT_SECTION))
    return split


INFERENCE_PLUGIN = "inference"


def init_inference(model, config=None, **kwargs):
    """Wrap ``model`` for inference: returns the ``InferenceEngine`` of the ``inference``
    plugin (``deepspeed.inference``), built from ``config`` (a dict or a JSON file path) merged
    with ``kwargs``.

    The core only asks the installed plugins (``deepspeed_init_inference``); without a plugin
    answering, the call fails naming the missing plugin.
    """
    catalog = PluginCatalog()
    engine = catalog.installed_hook.deepspeed_init_inference(model=model, config=config,
                                                             kwargs=dict(kwargs))
    if engine is None:
        from deepspeed.plugin_manager import ENTRY_POINT_GROUP, PluginError

        raise PluginError(
            f"deepspeed.init_inference needs the '{INFERENCE_PLUGIN}' plugin, registered "
            f"under the entry-point group "
            f"'{ENTRY_POINT_GROUP}'; no installed plugin answered deepspeed_init_inference. "
            f"Reinstall deepspeed (pip install -e .) or install a package providing it")
    return engine
