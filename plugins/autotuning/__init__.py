"""``deepspeed.autotuning``: find a fast DeepSpeed config by measuring it.

``deepspeed --autotuning tune|run script.py --deepspeed ds_config.json`` profiles the model,
runs the script as short experiments over ZeRO stage x micro-batch size (x ZeRO knobs with
``"fast": false``) through the same launcher, measures each with the engine's timers between
``start_profile_step`` and ``end_profile_step``, writes a summary per stage and the best config to
``results_dir``, and in ``run`` mode trains with it. ``deepspeed.autotuning.autotuner`` is the
search itself (upstream's documented module).
"""
from deepspeed.autotuning.autotuner import Autotuner, AutotuningError, run_autotuning
from deepspeed.autotuning.config import AutotuningConfig
from deepspeed.autotuning.space import NothingToTuneError

__all__ = ["Autotuner", "AutotuningConfig", "AutotuningError", "NothingToTuneError",
           "run_autotuning"]

from deepspeed.utils.lazy_exports import lazy_exports  # noqa: E402

# submodules load on first attribute access (`deepspeed.x.y.z` after a plain `import deepspeed`)
__getattr__, __dir__ = lazy_exports(__name__)
