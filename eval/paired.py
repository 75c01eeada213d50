"""Paired comparison of two systems on the same questions: the mean per-question difference of a metric,
its 95 % paired-bootstrap interval, and wins / ties / losses.

Method. For systems A and B scored on the same n questions, d_i = b_i - a_i. One bootstrap resample draws
n questions with replacement and takes the mean of their d_i; the interval is the 2.5th and 97.5th
percentile of `resamples` such means (the percentile interval: Efron & Tibshirani, *An Introduction to
the Bootstrap*, 1993, ch. 13.3). Resampling *questions* (the same draw for both systems) is the paired
bootstrap of Koehn, "Statistical Significance Tests for Machine Translation Evaluation", EMNLP 2004,
§4, and of Berg-Kirkpatrick, Burkett & Klein, "An Empirical Investigation of Statistical Significance
in NLP", EMNLP-CoNLL 2012, §2-3 (who also show why a difference of 1-2 points on a few hundred items is
often within noise). An interval that excludes 0 says the difference is larger than these questions can
produce by chance at the 5 % level (two-sided).

Vectorised (bench/bench_paired.py measures it): the resamples are one (resamples x n) matrix of how
often each question was drawn (`draw_counts`, from one `rng.integers` draw); the resampled means of
every metric column at once are one matrix product `counts @ diffs / n`. One seed fixes the draw, so
every pair and metric of a comparison is resampled over the same question draws, and a re-run gives
the same intervals. `reference_interval` in tests/test_paired.py recomputes it with plain loops.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

RESAMPLES = 10_000
SEED = 0
LEVEL = 0.95
TIE = 1e-9  # |difference| at or below this is a tie (scores are floats of 0-100 points)


def draw_counts(n: int, resamples: int = RESAMPLES, seed: int = SEED) -> np.ndarray:
    """(resamples, n) counts: how often each of n questions is drawn in each resample. The draw is
    `default_rng(seed).integers(0, n, (resamples, n))`, row r holding resample r's question indices."""
    idx = np.random.default_rng(seed).integers(0, n, size=(resamples, n))
    flat = (idx + (np.arange(resamples) * n)[:, None]).ravel()
    return np.bincount(flat, minlength=resamples * n).reshape(resamples, n)


@dataclass(frozen=True)
class Paired:
    """One metric column's paired result (arrays: one entry per column of `diffs`)."""

    n: np.ndarray  # questions with a value for both systems
    mean: np.ndarray  # mean difference (B - A)
    lo: np.ndarray  # interval bounds
    hi: np.ndarray
    wins: np.ndarray  # questions where B > A
    ties: np.ndarray
    losses: np.ndarray


def paired_bootstrap(diffs: np.ndarray, *, resamples: int = RESAMPLES, seed: int = SEED,
                     level: float = LEVEL) -> Paired:
    """`diffs`: (n questions, k columns) of per-question differences B - A, NaN where either system has
    no value. Each column's mean, `level` percentile interval and wins/ties/losses. Columns with the same
    questions present are resampled together (one draw per distinct set of present questions)."""
    d = np.asarray(diffs, dtype=np.float64)
    if d.ndim == 1:
        d = d[:, None]
    k = d.shape[1]
    present = ~np.isnan(d)
    out = {name: np.full(k, np.nan) for name in ("mean", "lo", "hi")}
    counts = {name: np.zeros(k, dtype=np.int64) for name in ("n", "wins", "ties", "losses")}
    tail = (1 - level) / 2 * 100
    groups: dict[bytes, list[int]] = {}
    for j in range(k):
        groups.setdefault(present[:, j].tobytes(), []).append(j)
    for cols in groups.values():
        rows = present[:, cols[0]]
        sub = d[rows][:, cols]
        n = sub.shape[0]
        counts["n"][cols] = n
        counts["wins"][cols] = (sub > TIE).sum(axis=0)
        counts["losses"][cols] = (sub < -TIE).sum(axis=0)
        counts["ties"][cols] = n - counts["wins"][cols] - counts["losses"][cols]
        if n == 0:
            continue
        means = draw_counts(n, resamples, seed) @ sub / n  # (resamples, len(cols))
        out["mean"][cols] = sub.mean(axis=0)
        out["lo"][cols], out["hi"][cols] = np.percentile(means, [tail, 100 - tail], axis=0)
    return Paired(counts["n"], out["mean"], out["lo"], out["hi"], counts["wins"], counts["ties"], counts["losses"])


def interval(a, b, *, resamples: int = RESAMPLES, seed: int = SEED) -> tuple[float, float, float]:
    """(mean of b - a, lo, hi) for two aligned per-question arrays of one metric."""
    got = paired_bootstrap(np.asarray(b, dtype=np.float64) - np.asarray(a, dtype=np.float64),
                           resamples=resamples, seed=seed)
    return float(got.mean[0]), float(got.lo[0]), float(got.hi[0])
