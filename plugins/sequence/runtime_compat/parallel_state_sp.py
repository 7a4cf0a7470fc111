"""Upstream path `deepspeed.runtime.sequence_parallel.parallel_state_sp`; it is the same module
object as `deepspeed.sequence.parallel_state`, so either name works as the ``mpu``."""
import sys

from deepspeed.sequence import parallel_state

sys.modules[__name__] = parallel_state
