"""Random layer-token drop (random-LTD): selected layers process a random subset of tokens."""
from .basic_layer import RandomLayerTokenDrop
from .helper import convert_to_random_ltd, remove_random_ltd_state_dict
from .scheduler import RandomLTDScheduler, consumed_layer_tokens

__all__ = ["RandomLayerTokenDrop", "RandomLTDScheduler", "convert_to_random_ltd",
           "remove_random_ltd_state_dict", "consumed_layer_tokens"]

from deepspeed.utils.lazy_exports import lazy_exports  # noqa: E402

# submodules load on first attribute access (`deepspeed.x.y.z` after a plain `import deepspeed`)
__getattr__, __dir__ = lazy_exports(__name__)
