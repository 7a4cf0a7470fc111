"""``deepspeed.autotuning``: find a fast DeepSpeed config by measuring it.

``deepspeed --autotuning tune|run script.py --deepspeed ds_config.json`` profiles the model,
runs the script as short experiments over ZeRO stage x micro-batch size (x ZeRO knobs with
``"fast": false``) through the same launcher, measures each with the engine's timers between
``start_profile_step`` and ``end_profile_step``, writes a summary per stage and the best config to
``results_dir``, and in ``run`` mode trains with it. ``deepspeed.autotuning.autotuner`` is the
search itself (upstream's documented module).
"""
from deepspeed.utils.lazy_exports import lazy_exports

# imported on first access: the launcher loads this plugin for its flags on every launch, and
# the search (numpy, the tuners) is needed only when --autotuning is given
_EXPORTS = {
    "Autotuner": "deepspeed.autotuning.autotuner",
    "AutotuningError": "deepspeed.autotuning.autotuner",
    "run_autotuning": "deepspeed.autotuning.autotuner",
    "AutotuningConfig": "deepspeed.autotuning.config",
    "NothingToTuneError": "deepspeed.autotuning.space",
}

__all__ = sorted(_EXPORTS)

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
