"""The paired statistics (eval/paired.py): the bootstrap against a plain loop implementation of the same method
and against scipy.stats.bootstrap, the permutation p-value against scipy.stats.permutation_test, Holm and the
minimum detectable effect against their definitions, and the minimum n."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest

from clarify.eval.paired import MIN_N, holm, mde, paired_bootstrap, paired_tests, permutation_p


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


# --- the tests beside the interval: permutation p-values, Holm, the minimum detectable effect, MIN_N ---------


def _seeded_diffs(n: int, k: int, seed: int) -> np.ndarray:
    """k metric columns of n paired differences: 0/100 STR-EM-like, ROUGE-like floats, a column with ties."""
    rng = np.random.default_rng(seed)
    cols = [100.0 * (rng.random(n) < 0.45) - 100.0 * (rng.random(n) < 0.3), rng.normal(1.5, 6.0, n),
            np.where(rng.random(n) < 0.5, 0.0, rng.normal(0.4, 2.0, n))]
    return np.column_stack(cols[:k])


def test_exact_permutation_p_equals_scipy():
    """With 2**n <= resamples both enumerate every sign assignment: the same p-value to the last bit."""
    from scipy import stats

    for n, seed in ((6, 1), (9, 2), (13, 3)):
        d = _seeded_diffs(n, 3, seed)
        got = permutation_p(d, resamples=10_000)
        for j in range(3):
            want = stats.permutation_test((d[:, j],), np.mean, permutation_type="samples", n_resamples=10_000,
                                          alternative="two-sided").pvalue
            assert got[j] == pytest.approx(want, abs=1e-12), (n, j)


def test_randomized_permutation_p_agrees_with_scipy_within_its_noise():
    """Past 2**n > resamples both draw random sign assignments (different draws): the two estimates of the
    same p-value agree within the Monte Carlo error of two independent 20,000-draw estimates."""
    from scipy import stats

    d = _seeded_diffs(80, 3, 7)
    got = permutation_p(d, resamples=20_000, seed=5)
    for j in range(3):
        want = stats.permutation_test((d[:, j],), np.mean, permutation_type="samples", n_resamples=20_000,
                                      rng=np.random.default_rng(11)).pvalue
        noise = math.sqrt(2 * max(want * (1 - want), 1e-4) / 20_000)
        assert abs(got[j] - want) <= 5 * noise, (j, got[j], want)
    assert 0 < got.min() and got.max() <= 1
    # seeded: a re-run gives the same p-values
    assert permutation_p(d, resamples=20_000, seed=5).tolist() == got.tolist()


def test_bootstrap_interval_agrees_with_scipy_bootstrap_on_the_differences():
    """scipy.stats.bootstrap's percentile interval of the mean of the paired differences: the same method
    (different draws), so the bounds agree within resampling noise (a few % of the standard error)."""
    from scipy import stats

    d = _seeded_diffs(120, 3, 9)
    got = paired_bootstrap(d, resamples=20_000, seed=3)
    for j in range(3):
        want = stats.bootstrap((d[:, j],), np.mean, method="percentile", n_resamples=20_000,
                               rng=np.random.default_rng(4)).confidence_interval
        se = d[:, j].std(ddof=1) / math.sqrt(len(d))
        assert abs(got.lo[j] - want.low) < 0.1 * se and abs(got.hi[j] - want.high) < 0.1 * se, j


def test_holm_adjusts_as_the_step_down_procedure():
    # Holm (1979): sorted p (0.005, 0.01, 0.03, 0.04) of m = 4 -> 4*0.005, 3*0.01, 2*0.03, max(1*0.04, 0.06)
    got = holm(np.array([0.01, 0.04, np.nan, 0.03, 0.005]))
    assert got[[0, 1, 3, 4]] == pytest.approx([0.03, 0.06, 0.06, 0.02]) and math.isnan(got[2])
    assert holm(np.array([0.5, 0.9])).tolist() == [1.0, 1.0]  # capped at 1
    # against the definition on seeded p-values: sorted, adjusted = running max of (m - rank) * p
    p = np.random.default_rng(0).random(25) ** 3
    order = np.argsort(p)
    want = np.maximum.accumulate(np.minimum(1, (25 - np.arange(25)) * p[order]))
    assert holm(p)[order] == pytest.approx(want)


def test_minimum_detectable_effect_is_the_power_formula():
    d = _seeded_diffs(50, 3, 4)
    z = 1.959963984540054 + 0.8416212335729143  # z_0.975 + z_0.80
    assert mde(d) == pytest.approx(z * d.std(axis=0, ddof=1) / math.sqrt(50))
    # four times the questions with the same spread halve it (up to the SD's n - 1: sqrt(4 x 49 / 199) / 2)
    assert mde(np.tile(d, (4, 1))) == pytest.approx(mde(d) * math.sqrt(4 * 49 / 199) / 2)


def test_below_the_minimum_n_there_is_no_interval_and_no_test():
    """n = 1 (the case that was marked significant) up to MIN_N - 1: the mean and wins/ties/losses only.
    MIN_N is the first n at which the exact permutation test can reach p < 0.05 at all."""
    assert 2 / 2 ** (MIN_N - 1) > 0.05 >= 2 / 2**MIN_N
    for n in range(1, MIN_N):
        got = paired_tests(np.full((n, 1), 33.3))
        assert got.paired.mean[0] == pytest.approx(33.3) and got.paired.wins[0] == n
        assert math.isnan(got.paired.lo[0]) and math.isnan(got.paired.hi[0])
        assert math.isnan(got.p[0]) and math.isnan(got.mde[0])
    at = paired_tests(np.full((MIN_N, 1), 33.3))
    assert at.p[0] == pytest.approx(2 / 2**MIN_N) and at.paired.lo[0] == pytest.approx(33.3)
    # columns with different questions present: each judged on its own n
    d = np.column_stack([np.arange(10.0), np.where(np.arange(10) < 4, 1.0, np.nan)])
    mixed = paired_tests(d)
    assert not math.isnan(mixed.p[0]) and math.isnan(mixed.p[1]) and mixed.paired.n.tolist() == [10, 4]
