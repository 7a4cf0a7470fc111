"""Upstream path of ``deepspeed.sparse_attention`` (the plugin is the real home)."""
from deepspeed.sparse_attention import *  # noqa: F401,F403
from deepspeed.sparse_attention import __all__  # noqa: F401
