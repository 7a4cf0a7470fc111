"""DeepSpeed: a slim training engine whose features arrive as pluggy plugins.

The public entry points live here so that `import deepspeed` is all a user script needs.
"""
from deepspeed.version import __version__, version

__all__ = ["__version__", "version"]
