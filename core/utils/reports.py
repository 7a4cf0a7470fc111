"""What the engine reports when the config asks: ``memory_breakdown`` and ``dump_state``.

``see_memory_usage`` is upstream's ``deepspeed.runtime.utils`` helper. A memory report is three
lines on global rank 0: the message, the accelerator's allocated / peak allocated / reserved
(cached) / peak reserved memory in GB, and the host's used virtual memory. The accelerator's peak
counters are reset after each report, so a "Max_" figure is the peak since the previous report.
``print_configuration`` lists an object's attributes, as ``dump_state`` prints the engine's.
"""
import gc

from deepspeed.utils.logging import logger

GB = 1024 ** 3


def _gb(value) -> float:
    return round(float(value or 0) / GB, 2)


def memory_report(message: str) -> str:
    """The report's text (all three lines), without logging it or resetting the peaks."""
    import psutil

    from deepspeed.accelerator import get_accelerator

    accelerator = get_accelerator()
    vm = psutil.virtual_memory()
    return (f"{message}\n"
            f"MA {_gb(accelerator.memory_allocated())} GB "
            f"Max_MA {_gb(accelerator.max_memory_allocated())} GB "
            f"CA {_gb(accelerator.memory_reserved())} GB "
            f"Max_CA {_gb(accelerator.max_memory_reserved())} GB\n"
            f"CPU Virtual Memory:  used = {_gb(vm.total - vm.available)} GB, "
            f"percent = {vm.percent}%")


def see_memory_usage(message: str, force: bool = False) -> None:
    """Log a memory report on global rank 0 when ``force`` (upstream's signature: callers pass
    ``force=config.memory_breakdown``, so the call costs nothing when the report is off)."""
    if not force:
        return
    from deepspeed.accelerator import get_accelerator
    from deepspeed.utils.logging import current_rank

    if current_rank() != 0:
        return
    gc.collect()  # what Python still holds but no longer uses is not what training needs
    logger.info(memory_report(message))
    get_accelerator().reset_peak_memory_stats()


def print_configuration(obj, name: str) -> None:
    """Log every public attribute of ``obj`` as ``  name ....... value`` lines on global rank 0
    (``dump_state``: the engine's state after initialisation, as upstream prints it)."""
    from deepspeed.utils.logging import log_dist

    names = sorted(key for key in vars(obj) if not key.startswith("_"))
    lines = [f"{name}:"]
    for key in names:
        lines.append(f"  {key} {'.' * max(3, 29 - len(key))} {getattr(obj, key)!r}")
    log_dist("\n".join(lines), ranks=[0])
