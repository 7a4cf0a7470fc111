"""Progress bars for the long offline jobs (checkpoint conversion, data analysis, autotuning).

A bar is drawn only when its stream is a terminal: in a log file, a CI run or a pipe it would be
hundreds of carriage-returned lines, so there it draws nothing and the job prints what it printed
before. tqdm (a dependency, as upstream's) decides that itself with ``disable=None``; this module
only fixes the stream (stderr, so a bar never mixes with data a job writes to stdout) and lets a
caller turn bars off.
"""
import sys

from tqdm import tqdm


def progress(iterable=None, *, total=None, desc=None, unit="it", leave=True, enabled=True,
             file=None):
    """``tqdm(iterable)`` drawn on ``file`` (default stderr) when that is a terminal and
    ``enabled``; otherwise the same object draws nothing, so callers never branch on it. Used
    without an iterable, ``update(n)`` advances it; ``close()`` (or ``with``) ends it."""
    return tqdm(iterable, total=total, desc=desc, unit=unit, leave=leave,
                file=file if file is not None else sys.stderr,
                disable=None if enabled else True, dynamic_ncols=True)


def progress_write(message, bar=None):
    """Print ``message`` on its own line (stdout) without tearing an active bar apart."""
    if bar is not None and not bar.disable:
        bar.write(message, file=sys.stdout)
    else:
        print(message, flush=True)
