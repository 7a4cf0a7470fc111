"""`deepspeed.runtime.sequence_parallel`: the upstream path of the sequence-parallel plugin."""

from deepspeed.utils.lazy_exports import lazy_exports  # noqa: E402

# submodules load on first attribute access (`deepspeed.x.y.z` after a plain `import deepspeed`)
__getattr__, __dir__ = lazy_exports(__name__)
