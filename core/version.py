"""The DeepSpeed API level this package implements.

Transformers and Accelerate gate features on `deepspeed.__version__` (e.g. `>= 0.9.3`,
`>= 0.14`); the number states which documented DeepSpeed API we follow (the 0.14.1 reference in
`shared/spec`), not a count of our own releases.
"""
__version__ = "0.14.1"
version = __version__
