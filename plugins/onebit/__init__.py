"""1-bit communication for data-parallel training: 1-bit Adam, 0/1 Adam and 1-bit LAMB.

``deepspeed.onebit.OnebitAdam`` / ``ZeroOneAdam`` / ``OnebitLamb`` (also spelled ``OneBitAdam``,
``OneBitLamb``) are torch optimizers; the ``onebit`` plugin (``plugin.py``) builds them from the
config and turns the engine's gradient all-reduce off while they exchange compressed momenta.
Modules: ``packing`` (sign bits), ``transports`` (deepspeed.comm or MPI), ``compressed`` (the
error-compensated 1-bit all-reduce), ``base`` / ``adam`` / ``zoadam`` / ``lamb`` (the optimizers),
``schedules`` (0/1 Adam's step policies).
"""

from deepspeed.utils.lazy_exports import lazy_exports

_EXPORTS = {
    "OnebitAdam": "deepspeed.onebit.adam",
    "OneBitAdam": "deepspeed.onebit.adam",
    "ZeroOneAdam": "deepspeed.onebit.zoadam",
    "OnebitLamb": "deepspeed.onebit.lamb",
    "OneBitLamb": "deepspeed.onebit.lamb",
    "CompressedAllreduce": "deepspeed.onebit.compressed",
}

__all__ = ["OnebitAdam", "OneBitAdam", "ZeroOneAdam", "OnebitLamb", "OneBitLamb",
           "CompressedAllreduce"]

# loaded on first use: the plugin catalog imports this package with every run (see lazy_exports)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
