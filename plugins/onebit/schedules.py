"""0/1 Adam's two step policies, as pure functions of the step count (so every rank, and a run
resumed from a checkpoint, agrees without saving or exchanging anything).

- Variance updates (``var_update_scaler`` = κ): at steps ``t_0 = 1`` and
  ``t_{j+1} = t_j + 2^⌊j/κ⌋`` up to ``var_freeze_step`` (the last step that may update it). With
  κ = 2 the gaps are 1, 1, 2, 2, 4, 4, ...
- Synchronisations after the freeze (``local_step_scaler`` = α, ``local_step_clipper`` = H): at
  ``s_0 = var_freeze_step + 1`` and ``s_{j} = s_{j-1} + min(2^⌊j/α⌋, H)``, measured from
  ``var_freeze_step``: with α = 2, H = 4 the gaps are 1, 1, 2, 2, 4, 4, 4, ... Between them the
  ranks take local steps without communicating.
"""
import bisect


def variance_steps(var_freeze_step, var_update_scaler):
    """The sorted list of steps that update the variance."""
    steps, step, j = [], 1, 0
    while step <= var_freeze_step:
        steps.append(step)
        step += 2 ** (j // var_update_scaler)
        j += 1
    return steps


class SyncSchedule:
    """Answers "is step ``t`` a synchronisation?" for steps after ``var_freeze_step``."""

    def __init__(self, var_freeze_step, local_step_scaler, local_step_clipper):
        self.scaler, self.clipper = local_step_scaler, local_step_clipper
        self._steps = [var_freeze_step + 1]

    def gap(self, j):
        return min(2 ** min(j // self.scaler, 62), self.clipper)

    def is_sync(self, step):
        while self._steps[-1] < step:
            self._steps.append(self._steps[-1] + self.gap(len(self._steps)))
        index = bisect.bisect_left(self._steps, step)
        return index < len(self._steps) and self._steps[index] == step
