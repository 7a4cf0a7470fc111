"""Memory measurements for tests and benchmarks (`deepspeed.testing.memory`).

``peak_bytes(fn)``: the highest amount of tensor memory allocated while ``fn`` runs, above what
was allocated before. On CUDA it is the caching allocator's peak counter; on CPU, where torch
keeps no such counter, it replays the allocation and free events of the torch profiler in time
order. Used to show that an op's memory-saving path really allocates less than the naive one.
"""
import torch


def _cpu_peak(fn):
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        result = fn()
    events = sorted((e.start_ns(), e.nbytes()) for e in prof.profiler.kineto_results.events()
                    if e.name() == "[memory]" and e.device_type().name == "CPU")
    level = peak = 0
    for _, nbytes in events:
        level += nbytes
        peak = max(peak, level)
    return peak, result


def peak_bytes(fn, device="cpu"):
    """(peak bytes allocated above the starting level while ``fn()`` runs, its result)."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)
        start = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        result = fn()
        torch.cuda.synchronize(device)
        return torch.cuda.max_memory_allocated(device) - start, result
    return _cpu_peak(fn)
