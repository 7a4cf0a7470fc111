"""Wall-clock timers for `wall_clock_breakdown` and the throughput line of `steps_per_print`.

Device work is asynchronous, so a timer synchronizes the accelerator before reading the clock;
that costs throughput, which is why the engine only times when `wall_clock_breakdown` is on.
"""
import time

from deepspeed.accelerator import get_accelerator
from deepspeed.utils.logging import log_dist


class _Timer:
    def __init__(self, name):
        self.name = name
        self.elapsed_s = 0.0
        self.count = 0
        self.last_ms = None  # the latest interval (monitors log it per step)
        self._start = None

    def start(self):
        assert self._start is None, f"timer '{self.name}' started twice"
        get_accelerator().synchronize()
        self._start = time.perf_counter()

    def stop(self):
        assert self._start is not None, f"timer '{self.name}' stopped before it started"
        get_accelerator().synchronize()
        interval = time.perf_counter() - self._start
        self.elapsed_s += interval
        self.last_ms = 1000.0 * interval
        self.count += 1
        self._start = None

    def mean_ms(self):
        return 1000.0 * self.elapsed_s / max(1, self.count)

    def reset(self):
        self.elapsed_s, self.count, self._start = 0.0, 0, None


class SynchronizedWallClockTimer:
    """Named timers; ``timers("forward").start()`` ... ``.stop()``, then ``log(names)``."""

    def __init__(self):
        self.timers = {}

    def __call__(self, name):
        if name not in self.timers:
            self.timers[name] = _Timer(name)
        return self.timers[name]

    def names(self):
        return list(self.timers)

    def last_ms(self, name):
        timer = self.timers.get(name)
        return None if timer is None else timer.last_ms

    def log(self, names, reset=True, ranks=(0,)):
        parts = [f"{name}: {self.timers[name].mean_ms():.2f}" for name in names
                 if name in self.timers and self.timers[name].count]
        if parts:
            log_dist("time (ms) | " + " | ".join(parts), ranks=ranks)
        if reset:
            for name in names:
                if name in self.timers:
                    self.timers[name].reset()


class NoopTimer:
    """Stands in for the timers when `wall_clock_breakdown` is off: no synchronization."""

    class _Noop:
        def start(self):
            pass

        def stop(self):
            pass

    _noop = _Noop()

    def __call__(self, name):
        return self._noop

    def names(self):
        return []

    def last_ms(self, name):
        return None

    def log(self, names, reset=True, ranks=(0,)):
        pass


class ThroughputTimer:
    """Samples per second between two ``steps_per_print`` reports (host clock, no sync)."""

    def __init__(self):
        self._since = time.perf_counter()
        self._samples = 0
        self.total_s = 0.0
        self.total_samples = 0

    def step(self, samples):
        """Count one optimizer step over ``samples`` samples (the global batch, which an
        engine may change between steps)."""
        self._samples += samples

    def report(self):
        """(current samples/s since the last report, running average samples/s)."""
        now = time.perf_counter()
        span = max(now - self._since, 1e-9)
        current = self._samples / span
        self.total_s += span
        self.total_samples += self._samples
        self._since, self._samples = now, 0
        average = self.total_samples / max(self.total_s, 1e-9)
        return current, average
