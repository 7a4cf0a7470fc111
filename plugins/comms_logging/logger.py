"""`CommsLogger`: records deepspeed.comm ops, prints them when verbose, summarises them.

It is a comm observer (callable with a `CommRecord`) that also answers
`deepspeed.comm.log_summary()` through its `log_summary` method. The engine feeds it through the
`deepspeed_comm_op` hook; `deepspeed.comm.configure(enabled=True)` without an engine registers one
directly. When both paths feed the same logger, the second delivery of a record is ignored.
"""
import deepspeed.comm as dist
from deepspeed.comm.observers import paused
from deepspeed.comms_logging.config import CommsLoggerConfig
from deepspeed.comms_logging.summary import OpStats, format_size, render_table
from deepspeed.utils.logging import log_dist
from deepspeed.utils.lazy_module import lazy_module

torch = lazy_module("torch")  # loaded on first use (the launcher imports this plugin without torch)


def verbose_line(record, name) -> str:
    """The documented per-op line."""
    return (f"rank={record.rank} | comm op: {name} | time (ms): {record.latency_s * 1e3:.2f} | "
            f"msg size: {format_size(record.size_bytes)} | algbw (Gbps): {record.algbw_gbps:.2f} "
            f"| busbw (Gbps): {record.busbw_gbps:.2f}")


class CommsLogger:
    """One process's record of its communication.

    `settings` is anything with the comms_logger fields (enabled, verbose, prof_all, prof_ops,
    debug): the plugin's validated section, or core's live `CommsLoggerSettings` so that later
    `deepspeed.comm.configure(...)` calls take effect at once.
    """

    def __init__(self, settings=None):
        self.settings = settings if settings is not None else CommsLoggerConfig()
        self._stats = {}  # display name -> {message size in bytes -> OpStats}
        self._last = None

    def __call__(self, record) -> None:
        self.append(record)

    def wants(self, record) -> bool:
        """Whether `record` is to be logged: enabled, and every op (prof_all), a listed op
        (prof_ops, by op or log name), or a call made with prof=True."""
        s = self.settings
        if not s.enabled:
            return False
        return bool(s.prof_all or record.prof or record.op in s.prof_ops
                    or record.log_name in s.prof_ops)

    def display_name(self, record) -> str:
        if self.settings.debug and record.caller:
            return f"{record.log_name} | [Caller Func: {record.caller}]"
        return record.log_name

    def append(self, record) -> None:
        if record is self._last or not self.wants(record):
            return
        self._last = record
        name = self.display_name(record)
        stats = self._stats.setdefault(name, {}).setdefault(record.size_bytes, OpStats())
        stats.add(record.latency_s * 1e3, record.algbw_gbps, record.busbw_gbps,
                  getattr(record, "group_ranks", None))
        if self.settings.verbose:
            log_dist(verbose_line(record, name), ranks=[-1])

    def reset(self) -> None:
        """Forget what was recorded (e.g. after printing an epoch's summary)."""
        self._stats = {}
        self._last = None

    def summary(self, show_straggler=False):
        """{op name: {message size in bytes: {count, total/avg latency, tput/busbw averages}}};
        with `show_straggler`, also straggler and cross-rank min/max latency (collective: every
        rank must call it)."""
        result = {name: {size: stats.row() for size, stats in by_size.items()}
                  for name, by_size in self._stats.items()}
        if show_straggler:
            with paused():  # the straggler all-reduces must not be logged themselves
                self._add_stragglers(result)
        return result

    def log_summary(self, show_straggler=False, return_dict=False):
        """Print the summary table on global rank 0; return the dict when `return_dict`."""
        result = self.summary(show_straggler=show_straggler)
        if not dist.is_initialized() or dist.get_rank() == 0:
            print(render_table(result, show_straggler), flush=True)
        return result if return_dict else None

    # ------------------------------------------------------------------ stragglers
    def _add_stragglers(self, result) -> None:
        """Straggler = sum over calls of (own latency - the minimum latency of that call across
        ranks): the time this rank waited for the slowest to arrive. Calls are paired by
        (name, size, index); an entry whose call count differs between ranks gets None."""
        keys = sorted((name, size, len(stats.latencies_ms))
                      for name, by_size in self._stats.items() for size, stats in by_size.items())
        if dist.is_initialized() and dist.get_world_size() > 1:
            every = [None] * dist.get_world_size()
            dist.all_gather_object(every, keys)
            common = set(keys).intersection(*map(set, every))
        else:
            common = set(keys)
        shared = [key for key in keys if key in common]
        for name, by_size in self._stats.items():
            for size in by_size:
                if (name, size, len(by_size[size].latencies_ms)) not in common:
                    result[name][size].update(total_straggler_ms=None, avg_straggler_ms=None,
                                              min_latency_ms=None, max_latency_ms=None)
        if not shared:
            return
        own = torch.tensor([lat for name, size, _ in shared
                            for lat in self._stats[name][size].latencies_ms], dtype=torch.float64)
        low, high = own.clone(), own.clone()
        if dist.is_initialized() and dist.get_world_size() > 1:
            device = _comm_device()
            low, high = low.to(device), high.to(device)
            dist.all_reduce(low, op=dist.ReduceOp.MIN)
            dist.all_reduce(high, op=dist.ReduceOp.MAX)
            low, high = low.cpu(), high.cpu()
        start = 0
        for name, size, count in shared:
            stop = start + count
            waited = float((own[start:stop] - low[start:stop]).sum())
            result[name][size].update(total_straggler_ms=waited, avg_straggler_ms=waited / count,
                                      min_latency_ms=float(low[start:stop].min()),
                                      max_latency_ms=float(high[start:stop].max()))
            start = stop


def _comm_device():
    """Where collectives run: the accelerator's device (NCCL needs GPU tensors; gloo, CPU)."""
    from deepspeed.accelerator import get_accelerator

    return torch.device(get_accelerator().current_device_name())
