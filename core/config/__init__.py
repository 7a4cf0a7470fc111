"""DeepSpeed's config system (`deepspeed.config`).

`load_config_source` reads a dict / JSON(HJSON) file / base64 string; `DeepSpeedConfigModel` is
the pydantic base of every section (core and plugin); `DeepSpeedConfig` validates a whole config
against the core keys plus plugin-contributed sections and resolves the batch triangle.
"""
from deepspeed.config.batch import resolve_batch_triangle
from deepspeed.config.config import DeepSpeedConfig, resolve_world_size
from deepspeed.config.core_sections import (ActivationCheckpointingConfig, AmpConfig, BF16Config,
                                            CheckpointConfig, CoreConfig, DataTypesConfig,
                                            FP16Config, OptimizerConfig, SchedulerConfig)
from deepspeed.config.errors import ConfigDeprecationWarning, DeepSpeedConfigError
from deepspeed.config.feature_sections import FEATURE_SECTIONS
from deepspeed.config.loader import load_config_source
from deepspeed.config.model import DeepSpeedConfigModel, DeprecatedAlias, deprecated_alias

__all__ = [
    "DeepSpeedConfig", "DeepSpeedConfigModel", "DeepSpeedConfigError", "ConfigDeprecationWarning",
    "load_config_source", "deprecated_alias", "DeprecatedAlias", "FEATURE_SECTIONS",
    "resolve_batch_triangle", "resolve_world_size", "CoreConfig", "FP16Config", "BF16Config",
    "AmpConfig", "OptimizerConfig", "SchedulerConfig", "CheckpointConfig", "DataTypesConfig",
    "ActivationCheckpointingConfig",
]

from deepspeed.utils.lazy_exports import lazy_exports  # noqa: E402

# submodules load on first attribute access (`deepspeed.x.y.z` after a plain `import deepspeed`)
__getattr__, __dir__ = lazy_exports(__name__)
