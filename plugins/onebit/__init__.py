"""1-bit communication for data-parallel training: 1-bit Adam, 0/1 Adam and 1-bit LAMB.

``deepspeed.onebit.OnebitAdam`` / ``ZeroOneAdam`` / ``OnebitLamb`` (also spelled ``OneBitAdam``,
``OneBitLamb``) are torch optimizers; the ``onebit`` plugin (``plugin.py``) builds them from the
config and turns the engine's gradient all-reduce off while they exchange compressed momenta.
Modules: ``packing`` (sign bits), ``transports`` (deepspeed.comm or MPI), ``compressed`` (the
error-compensated 1-bit all-reduce), ``base`` / ``adam`` / ``zoadam`` / ``lamb`` (the optimizers),
``schedules`` (0/1 Adam's step policies).
"""
from deepspeed.onebit.adam import OneBitAdam, OnebitAdam
from deepspeed.onebit.compressed import CompressedAllreduce
from deepspeed.onebit.lamb import OneBitLamb, OnebitLamb
from deepspeed.onebit.zoadam import ZeroOneAdam

__all__ = ["OnebitAdam", "OneBitAdam", "ZeroOneAdam", "OnebitLamb", "OneBitLamb",
           "CompressedAllreduce"]
