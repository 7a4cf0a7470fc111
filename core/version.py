"""The DeepSpeed API level this package implements.

Transformers and Accelerate gate features on `deepspeed.__version__` (e.g. `>= 0.9.3`,
`>= 0.14`, and `>= 0.18.2` for ALST / Ulysses sequence parallelism); the number states which
documented DeepSpeed API we follow (the 0.14.1 API reference, plus the newer
tutorials it includes, ALST the newest of them), not a count of our own releases.
"""
__version__ = "0.18.2"
version = __version__
