"""DeepSpeed's learning-rate schedules (`deepspeed.lr_schedules`; the documented path
`deepspeed.runtime.lr_schedules` re-exports this package).

All five step once per *batch* and are resumable from a batch counter:

- `LRRangeTest`: grow the lr to find the divergence point (range_test.py)
- `OneCycle`: one lr cycle with inverse momentum, then decay (one_cycle.py)
- `WarmupLR`, `WarmupDecayLR`, `WarmupCosineLR`: warmup, then hold / linear / cosine (warmup.py)

`build_lr_scheduler(name, params, optimizer)` is what the engine calls for a config
``"scheduler": {"type": name, "params": params}`` (build.py).
"""
from deepspeed.lr_schedules.build import (DEEPSPEED_LR_SCHEDULES, build_lr_scheduler,
                                          get_lr_scheduler_class)
from deepspeed.lr_schedules.constants import *  # noqa: F401,F403  (upstream's module constants)
from deepspeed.lr_schedules.constants import VALID_LR_SCHEDULES
from deepspeed.lr_schedules.one_cycle import OneCycle
from deepspeed.lr_schedules.range_test import LRRangeTest
from deepspeed.lr_schedules.warmup import WarmupCosineLR, WarmupDecayLR, WarmupLR, WarmupTypeError

__all__ = ["LRRangeTest", "OneCycle", "WarmupLR", "WarmupDecayLR", "WarmupCosineLR",
           "WarmupTypeError", "VALID_LR_SCHEDULES", "DEEPSPEED_LR_SCHEDULES",
           "build_lr_scheduler", "get_lr_scheduler_class"]

from deepspeed.utils.lazy_exports import lazy_exports  # noqa: E402

# submodules load on first attribute access (`deepspeed.x.y.z` after a plain `import deepspeed`)
__getattr__, __dir__ = lazy_exports(__name__)
