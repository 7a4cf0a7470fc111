"""`deepspeed.runtime.config` -> `deepspeed.config`, and upstream's optimizer-name constants
(``ADAM_OPTIMIZER`` ...: the names ``optimizer.type`` accepts). The core builds the ones in
``deepspeed.optimizers``; names a plugin builds (the 1-bit optimizers') are that plugin's,
exported here through the entry-point group ``deepspeed.exports.runtime.config``."""
from deepspeed.config import DeepSpeedConfig, DeepSpeedConfigError  # noqa: F401
from deepspeed.optimizers import (ADAGRAD_OPTIMIZER, ADAM_OPTIMIZER, ADAM_W_MODE,  # noqa: F401
                                  ADAMW_OPTIMIZER, DEEPSPEED_OPTIMIZERS, LAMB_OPTIMIZER,
                                  LION_OPTIMIZER, MUADAM_OPTIMIZER, MUADAMW_OPTIMIZER,
                                  MUSGD_OPTIMIZER, TORCH_ADAM_PARAM)
from deepspeed.utils.lazy_exports import plugin_exports

__getattr__, __dir__ = plugin_exports(__name__)
