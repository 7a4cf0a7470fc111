"""``deepspeed.nvme``: upstream's import path of the NVMe benchmarking commands.

The real package is ``deepspeed.zero.nvme`` (the commands tune the ``aio`` section of ZeRO's NVMe
offload, so they live with ZeRO); setup.py maps this folder onto upstream's name.
"""
from deepspeed.zero.nvme import (HandleConfig, IoResult, ds_io_main, parse_size,
                                 parse_sweep_arguments, run_io, sweep_main)

__all__ = ["ds_io_main", "sweep_main", "parse_sweep_arguments", "HandleConfig", "IoResult",
           "parse_size", "run_io"]
