"""Tuners: in which order to run the experiments of one tuning space, and when to stop.

All three share the stopping rules: at most ``tuner_num_trials`` experiments, and stop after
``tuner_early_stopping`` experiments in a row that did not beat the best so far. ``gridsearch``
runs the points in order (small to large), ``random`` in a seeded random order, and
``model_based`` measures the two ends of the space first and then always runs the point a cost
model fitted to everything measured so far predicts to be best (a least-squares fit of the score
on log micro-batch size, its square, the stage and the knob values).
"""
import math
import random
from typing import Callable, List, Optional

import numpy as np

from deepspeed.autotuning.space import Point

Evaluate = Callable[[Point], Optional[float]]  # the score (higher is better); None: failed


def _features(point: Point) -> List[float]:
    x = math.log(point.micro_batch * point.gas)
    row = [1.0, x, x * x, float(point.stage)]
    for _key, value in point.knobs:
        row.append(math.log10(float(value)) if not isinstance(value, bool) and value
                   else float(value))
    return row


class Tuner:
    def __init__(self, points: List[Point], num_trials: int, early_stopping: int):
        self.points = list(points)
        self.num_trials = num_trials
        self.early_stopping = early_stopping
        self.results = []  # (point, score or None), in the order run

    def order(self):
        """Yield the next point to run (may look at ``self.results``)."""
        raise NotImplementedError

    def tune(self, evaluate: Evaluate, skip: Callable[[Point], bool] = lambda p: False):
        best, since_best = None, 0
        for point in self.order():
            if len(self.results) >= self.num_trials or since_best >= self.early_stopping:
                break
            if skip(point):
                continue
            score = evaluate(point)
            self.results.append((point, score))
            if score is not None and (best is None or score > best):
                best, since_best = score, 0
            else:
                since_best += 1
        return self.results


class GridSearchTuner(Tuner):
    def order(self):
        yield from self.points


class RandomTuner(Tuner):
    def __init__(self, *args, seed=0, **kwargs):
        super().__init__(*args, **kwargs)
        self.rng = random.Random(seed)

    def order(self):
        points = list(self.points)
        self.rng.shuffle(points)
        yield from points


class ModelBasedTuner(Tuner):
    def order(self):
        untried = list(self.points)
        for first in (untried[0], untried[-1]) if len(untried) > 1 else untried[:1]:
            untried.remove(first)
            yield first
        while untried:
            measured = [(p, s) for p, s in self.results if s is not None]
            if len(measured) < 2:
                yield untried.pop(0)
                continue
            width = max(len(_features(p)) for p in self.points)
            pad = lambda row: row + [0.0] * (width - len(row))  # noqa: E731
            x = np.array([pad(_features(p)) for p, _ in measured])
            y = np.array([s for _, s in measured])
            coef, *_ = np.linalg.lstsq(x, y, rcond=None)
            predicted = [float(np.dot(pad(_features(p)), coef)) for p in untried]
            yield untried.pop(int(np.argmax(predicted)))


TUNERS = {"gridsearch": GridSearchTuner, "random": RandomTuner, "model_based": ModelBasedTuner}


def make_tuner(tuner_type: str, points: List[Point], num_trials: int, early_stopping: int):
    return TUNERS[tuner_type](points, num_trials=num_trials, early_stopping=early_stopping)
