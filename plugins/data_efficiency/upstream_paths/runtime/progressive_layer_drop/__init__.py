"""``deepspeed.runtime.progressive_layer_drop`` (upstream path)."""
from deepspeed.data_efficiency.progressive_layer_drop import ProgressiveLayerDrop  # noqa: F401
