"""The paired bootstrap (eval/paired.py) against a plain loop implementation of the same method."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest

from clarify.eval.paired import paired_bootstrap


def reference_interval(a: list[float], b: list[float], resamples: int, seed: int) -> tuple[float, float, float]:
    """Koehn (2004) §4 with Efron & Tibshirani's percentile interval, one resample at a time: draw n
    question indices with replacement (the same numpy draw the product documents), average b - a over
    them, sort the means and read the 2.5 % and 97.5 % points with linear interpolation."""
    keep = [i for i in range(len(a)) if not (math.isnan(a[i]) or math.isnan(b[i]))]
    diffs = [b[i] - a[i] for i in keep]
    n = len(diffs)
    draws = np.random.default_rng(seed).integers(0, n, size=(resamples, n))
    means = []
    for r in range(resamples):
        total = 0.0
        for j in draws[r]:
            total += diffs[int(j)]
        means.append(total / n)
    means.sort()

    def pct(p: float) -> float:
        pos = p / 100 * (len(means) - 1)
        lo = math.floor(pos)
        hi = min(lo + 1, len(means) - 1)
        return means[lo] + (means[hi] - means[lo]) * (pos - lo)

    return sum(diffs) / n, pct(2.5), pct(97.5)


def test_vectorised_intervals_equal_the_loop_reference():
    rnd = random.Random(5)
    n = 60
    # three metrics of two systems on 60 questions: STR-EM-like 0/100, ROUGE-like floats, one with gaps
    a = [[100.0 * (rnd.random() < 0.3) for _ in range(n)], [rnd.uniform(0, 60) for _ in range(n)],
         [rnd.uniform(0, 1) if i % 7 else math.nan for i in range(n)]]
    b = [[100.0 * (rnd.random() < 0.45) for _ in range(n)], [x + rnd.gauss(2, 5) for x in a[1]],
         [rnd.uniform(0, 1) if i % 5 else math.nan for i in range(n)]]
    diffs = np.array([[bj - aj for aj, bj in zip(a[m], b[m])] for m in range(3)]).T
    got = paired_bootstrap(diffs, resamples=3000, seed=11)
    for m in range(3):
        mean, lo, hi = reference_interval(a[m], b[m], 3000, 11)
        assert got.mean[m] == pytest.approx(mean, abs=1e-12)
        assert (got.lo[m], got.hi[m]) == (pytest.approx(lo, abs=1e-9), pytest.approx(hi, abs=1e-9))
    # the column with gaps keeps only the questions both systems have
    assert got.n.tolist() == [60, 60, sum(1 for i in range(n) if i % 7 and i % 5)]


def test_wins_ties_losses_and_a_clear_difference():
    a = np.array([0.0, 100.0, 0.0, 50.0, 0.0] * 20)
    b = a + np.array([100.0, 0.0, 0.0, 10.0, 5.0] * 20)
    got = paired_bootstrap((b - a)[:, None])
    assert (got.wins[0], got.ties[0], got.losses[0]) == (60, 40, 0)
    assert got.lo[0] > 0  # every question gains or ties: the interval excludes 0
    same = paired_bootstrap(np.zeros((30, 1)))
    assert (same.lo[0], same.hi[0], same.ties[0]) == (0.0, 0.0, 30)
