"""``deepspeed.profiling``: the flops profiler and PyTorch-profiler helpers."""
