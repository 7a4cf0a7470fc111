"""``deepspeed.zero.nvme`` (upstream: ``deepspeed.nvme``): the NVMe benchmarking commands,
``ds_io`` (one read or write benchmark with the DeepNVMe handle) and ``ds_nvme_tune`` (a sweep
of the handle's parameters that prints the best ``aio`` config section)."""
from deepspeed.zero.nvme.ds_io import main as ds_io_main
from deepspeed.zero.nvme.io_bench import HandleConfig, IoResult, parse_size, run_io
from deepspeed.zero.nvme.sweep import main as sweep_main
from deepspeed.zero.nvme.sweep import parse_args as parse_sweep_arguments

__all__ = ["ds_io_main", "sweep_main", "parse_sweep_arguments", "HandleConfig", "IoResult",
           "parse_size", "run_io"]
