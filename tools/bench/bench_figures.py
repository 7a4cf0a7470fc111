"""What the GPU benchmarks share: the device's description and ceilings, a CUDA-event timer, and
one machine-readable record per benchmark.

Each benchmark run with ``--json PATH`` appends one line ``{"bench": name, "figures": {...},
"targets": {...}}`` to PATH; ``tools/gpu_check.sh`` collects every record into one file and
``gpu_summary.py`` turns it into the table the lease brings back. A target is a
``{"value", "op", "limit", "met"}`` record, so the summary can say which were met without
knowing the benchmark.
"""
import json
import statistics
import time

import torch

# Vendor datasheet memory bandwidth (TB/s) by device-name substring, most specific first: the
# "nominal peak" the ZeRO++ kernels' throughput is compared with. Leads, not measurements; the
# benchmarks also measure a device-to-device copy in the same run.
NOMINAL_TBS = (("H200", 4.8), ("H100 PCIe", 2.0), ("H100 NVL", 3.9), ("H100", 3.35),
               ("A100-SXM4-80GB", 2.039), ("A100 80GB PCIe", 1.935), ("A100", 1.555),
               ("L40S", 0.864), ("A10G", 0.6))


def device_info():
    """Device name, torch / CUDA / Triton versions, nominal bandwidth (None if unknown)."""
    info = {"torch": torch.__version__, "cuda": torch.version.cuda, "device": "cpu",
            "nominal_tbs": None}
    try:
        import triton

        info["triton"] = triton.__version__
    except ImportError:
        info["triton"] = None
    if torch.cuda.is_available():
        name = torch.cuda.get_device_name()
        props = torch.cuda.get_device_properties(0)
        info.update(device=name, sms=props.multi_processor_count,
                    memory_gib=round(props.total_memory / 2**30, 1),
                    nominal_tbs=next((tbs for key, tbs in NOMINAL_TBS if key in name), None))
    return info


def median_ms(fn, iters=20, warmup=3):
    """Median milliseconds of ``fn()``: CUDA events around each call on a GPU, the host clock
    (after the call returns) on a CPU."""
    for _ in range(warmup):
        fn()
    times = []
    cuda = torch.cuda.is_available()
    for _ in range(iters):
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end))
        else:
            start = time.perf_counter()
            fn()
            times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def copy_gbs(nbytes=1 << 31):
    """Device-to-device copy bandwidth in GB/s (bytes read + written), the practical ceiling
    of a memory-bound kernel; None without a GPU."""
    if not torch.cuda.is_available():
        return None
    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda").random_()
    dst = torch.empty_like(src)
    ms = median_ms(lambda: dst.copy_(src), iters=10)
    del src, dst
    torch.cuda.empty_cache()
    return 2 * nbytes / ms / 1e6


def target(value, op, limit):
    """A target record: ``value op limit`` (op is ">=" or "<=")."""
    met = None if value is None else (value >= limit if op == ">=" else value <= limit)
    return {"value": value, "op": op, "limit": limit, "met": met}


def emit(path, bench, figures, targets=None, dry_run=False):
    """Print the record and append it to ``path`` (when given). A dry run's record says so:
    its sizes are tiny and its targets mean nothing."""
    record = {"bench": bench, "device": device_info(), "dry_run": bool(dry_run),
              "figures": figures, "targets": targets or {}}
    line = json.dumps(record, default=str)
    print("FIGURES " + line)
    if path:
        with open(path, "a") as handle:
            handle.write(line + "\n")
    return record
