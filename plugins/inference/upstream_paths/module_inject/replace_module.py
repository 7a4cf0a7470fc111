"""``deepspeed.module_inject.replace_module`` (upstream path) -> ``deepspeed.inference.replace``."""
from deepspeed.inference.replace import replace_transformer_layer  # noqa: F401
