"""``deepspeed.compression``: the model compression library (weight / activation quantization,
sparse, row, head and channel pruning, layer reduction) and mixture-of-quantization (MoQ).

``compress.init_compression`` swaps a model's layers for compression-aware ones
(``basic_layer``); the engine advances their schedules after every optimizer step through this
plugin's hooks; ``compress.redundancy_clean`` turns the masked model into a physically smaller
one.
"""

from deepspeed.utils.lazy_exports import lazy_exports  # noqa: E402

# submodules load on first attribute access (`deepspeed.x.y.z` after a plain `import deepspeed`)
__getattr__, __dir__ = lazy_exports(__name__)
