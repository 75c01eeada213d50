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

Beyond the interval (`paired_tests`), so that a comparison is honest at any number of questions:

* **A minimum n (MIN_N = 6).** The paired permutation test below cannot reach p < 0.05 from fewer than
  6 questions whatever the scores: its smallest two-sided p-value is 2 / 2**n (every difference of one
  sign, exact test), 0.0625 at n = 5. A bootstrap interval from so few questions only repeats the sample
  (n = 1 gives the one difference as both bounds). Below MIN_N the difference is shown without an
  interval, a p-value or a mark.
* **An approximate-randomization p-value** (`permutation_p`): the paired permutation test by sign flips.
  Under the null hypothesis that the two systems are exchangeable on each question, each d_i is as likely
  as -d_i; the p-value is the share of sign assignments whose mean is at least as extreme as the observed
  one (Noreen, *Computer-Intensive Methods for Testing Hypotheses*, 1989, ch. 2; Riezler & Maxwell, "On
  Some Pitfalls in Automatic Evaluation and Significance Testing for MT", 2005, §3; Dror et al., "The
  Hitchhiker's Guide to Testing Statistical Significance in NLP", ACL 2018, §3). Exact (all 2**n
  assignments) when 2**n <= resamples, else `resamples` random assignments with the +1 correction of
  Phipson & Smyth (2010); two-sided as twice the smaller one-sided p-value, capped at 1. These are the
  definitions of scipy.stats.permutation_test(permutation_type="samples") (scipy/stats/_resampling.py
  `permutation_test`), which tests/test_paired.py checks against.
* **Holm-Bonferroni** (`holm`) over every test a comparison shows (metrics x pairs of runs): Holm, "A
  Simple Sequentially Rejective Multiple Test Procedure", Scand. J. Statistics 6(2), 1979. Sorted
  ascending, p_(i) is adjusted to max over j <= i of min(1, (m - j + 1) p_(j)); a difference survives when
  its adjusted p-value is below 0.05. It controls the family-wise error rate at 5 % under any dependence
  between the tests (the metrics of one pair are strongly correlated).
* **The minimum detectable effect** (`mde`): the true mean difference that a two-sided 5 % test on n
  paired questions would detect with 80 % power, (z_0.975 + z_0.80) x sd(d) / sqrt(n) with the sample
  standard deviation of the per-question differences (Cohen, *Statistical Power Analysis for the
  Behavioral Sciences*, 1988, ch. 2, normal approximation; Card et al., "With Little Power Comes Great
  Responsibility", EMNLP 2020, §2, for NLP). A difference below it cannot be told from noise at this n.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist

import numpy as np

RESAMPLES = 10_000
SEED = 0
LEVEL = 0.95
TIE = 1e-9  # |difference| at or below this is a tie (scores are floats of 0-100 points)
MIN_N = 6  # fewest questions for an interval and a test: 2 / 2**5 = 0.0625 > ALPHA (module docstring)
ALPHA = 0.05  # the family-wise error rate Holm's procedure holds; the tests are two-sided
POWER = 0.80  # the power at which `mde` states the smallest detectable difference (Cohen 1988's convention)


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


def permutation_p(diffs: np.ndarray, *, resamples: int = RESAMPLES, seed: int = SEED) -> np.ndarray:
    """Two-sided paired permutation (approximate randomization) p-value of each column's mean difference
    (module docstring). `diffs`: (n, k) with no NaN. Exact over all 2**n sign assignments when
    2**n <= resamples, else `resamples` random ones, one draw shared by every column (seeded)."""
    d = np.asarray(diffs, dtype=np.float64)
    if d.ndim == 1:
        d = d[:, None]
    n, k = d.shape
    if n == 0:
        return np.full(k, np.nan)
    observed = d.mean(axis=0)
    exact = n < 63 and 2**n <= resamples
    if exact:  # row r: the bits of r as signs (+1 for 0, -1 for 1)
        bits = (np.arange(2**n)[:, None] >> np.arange(n)[None, :]) & 1
        signs_all, count = [1.0 - 2.0 * bits], 2**n
    else:
        rng = np.random.default_rng(seed)
        # in blocks of rows: 10,000 x 948 signs at once would be 76 MB
        block = max(1, 2_000_000 // n)
        signs_all = [1.0 - 2.0 * rng.integers(0, 2, size=(min(block, resamples - r), n))
                     for r in range(0, resamples, block)]
        count = resamples
    # scipy's tolerance for null means equal to the observed one up to rounding (_resampling.py `gamma`)
    gamma = np.abs(np.finfo(np.float64).eps * 100 * observed)
    less = np.zeros(k)
    greater = np.zeros(k)
    for signs in signs_all:
        null = signs @ d / n
        less += (null <= observed + gamma).sum(axis=0)
        greater += (null >= observed - gamma).sum(axis=0)
    adjust = 0 if exact else 1  # Phipson & Smyth (2010): the observed assignment counts as one of the draws
    p_less = (less + adjust) / (count + adjust)
    p_greater = (greater + adjust) / (count + adjust)
    return np.clip(2 * np.minimum(p_less, p_greater), 0.0, 1.0)


def holm(pvalues: np.ndarray) -> np.ndarray:
    """Holm-Bonferroni adjusted p-values (module docstring); NaN entries (no test) stay NaN and are not
    counted in the family."""
    p = np.asarray(pvalues, dtype=np.float64)
    out = np.full(p.shape, np.nan)
    tested = np.flatnonzero(~np.isnan(p))
    m = tested.size
    if m == 0:
        return out
    order = tested[np.argsort(p[tested], kind="stable")]
    running = 0.0
    for rank, idx in enumerate(order):
        running = max(running, min(1.0, (m - rank) * p[idx]))
        out[idx] = running
    return out


def mde(diffs: np.ndarray, *, alpha: float = ALPHA, power: float = POWER) -> np.ndarray:
    """Each column's minimum detectable effect at its n (module docstring): (z_(1-alpha/2) + z_power) x
    sd(d) / sqrt(n), sd with n - 1 degrees of freedom; NaN below 2 questions. `diffs`: (n, k), no NaN."""
    d = np.asarray(diffs, dtype=np.float64)
    if d.ndim == 1:
        d = d[:, None]
    n = d.shape[0]
    if n < 2:
        return np.full(d.shape[1], np.nan)
    z = NormalDist().inv_cdf(1 - alpha / 2) + NormalDist().inv_cdf(power)
    return z * d.std(axis=0, ddof=1) / math.sqrt(n)


@dataclass(frozen=True)
class Tested:
    """`paired_tests`' result: the bootstrap's `Paired` (interval NaN below MIN_N) and, per column, the
    permutation p-value and the minimum detectable effect (both NaN below MIN_N)."""

    paired: Paired
    p: np.ndarray
    mde: np.ndarray


def paired_tests(diffs: np.ndarray, *, resamples: int = RESAMPLES, seed: int = SEED) -> Tested:
    """The paired bootstrap interval, the permutation p-value and the minimum detectable effect of every
    column of `diffs` ((n, k), NaN where either system has no value: each column uses the questions it
    has). Columns with fewer than MIN_N questions keep their mean and wins/ties/losses only. Holm's
    adjustment is the caller's: it spans every column and pair a comparison shows (`holm`)."""
    d = np.asarray(diffs, dtype=np.float64)
    if d.ndim == 1:
        d = d[:, None]
    got = paired_bootstrap(d, resamples=resamples, seed=seed)
    k = d.shape[1]
    p = np.full(k, np.nan)
    effect = np.full(k, np.nan)
    present = ~np.isnan(d)
    groups: dict[bytes, list[int]] = {}
    for j in range(k):
        groups.setdefault(present[:, j].tobytes(), []).append(j)
    for cols in groups.values():
        sub = d[present[:, cols[0]]][:, cols]
        if sub.shape[0] < MIN_N:
            continue
        p[cols] = permutation_p(sub, resamples=resamples, seed=seed)
        effect[cols] = mde(sub)
    small = got.n < MIN_N
    lo, hi = got.lo.copy(), got.hi.copy()
    lo[small] = np.nan
    hi[small] = np.nan
    return Tested(Paired(got.n, got.mean, lo, hi, got.wins, got.ties, got.losses), p, effect)
