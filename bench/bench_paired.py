"""The paired bootstrap of `clarify compare` / `clarify report` (eval/paired.py) at a comparison's size:
948 questions (all of ASQA dev) x 10 metrics x 3 pairs of models (three models), 10,000 resamples, and
a few other question counts; against the loop reference (tests/test_paired.py) on a small size, for the
ratio. The per-question values are synthetic (the bootstrap's cost depends only on the array's shape).

    .venv/bin/python bench/bench_paired.py

Prints the CPU and the times; writes bench/results/paired.json and bench/results/paired.png (seconds
against questions).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/ importable from a checkout
from provenance import cpu_model, provenance  # noqa: E402

from clarify.eval.paired import RESAMPLES, paired_bootstrap  # noqa: E402

METRICS, PAIRS = 10, 3
SIZES = (100, 300, 948, 3000)
OUT = Path(__file__).parent / "results"


def diffs(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).normal(0, 20, size=(n, METRICS * PAIRS))


def timed(n: int, repeats: int = 3) -> float:
    d = diffs(n)
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        paired_bootstrap(d, resamples=RESAMPLES)
        best = min(best, time.perf_counter() - t0)
    return best


def main() -> None:
    from tests.test_paired import reference_interval

    cpu = cpu_model()
    print(f"CPU: {cpu}", flush=True)
    rows = [{"questions": n, "columns": METRICS * PAIRS, "resamples": RESAMPLES, "seconds": round(timed(n), 4)}
            for n in SIZES]
    for r in rows:
        print(f"{r['questions']:>5} questions x {r['columns']} columns x {r['resamples']} resamples: {r['seconds']:.3f} s")
    # the loop reference on one column of 100 questions, 1,000 resamples: the per-(column x resample x
    # question) cost of each, as a ratio
    d = diffs(100)[:, 0]
    t0 = time.perf_counter()
    reference_interval([0.0] * 100, d.tolist(), 1000, 0)
    loop_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    paired_bootstrap(d[:, None], resamples=1000)
    vec_s = time.perf_counter() - t0
    result = {"provenance": provenance(), "cpu": cpu, "sizes": rows, "s_948q_30col": next(r["seconds"] for r in rows if r["questions"] == 948),
              "reference_loop_100q_1col_1000r_s": round(loop_s, 4), "vectorised_same_s": round(vec_s, 5),
              "loop_over_vectorised": round(loop_s / vec_s, 1)}
    print(f"loop reference / vectorised on 100 questions x 1 column x 1,000 resamples: {result['loop_over_vectorised']}x")
    OUT.mkdir(exist_ok=True)
    (OUT / "paired.json").write_text(json.dumps(result, indent=2) + "\n")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.2, 3.4))
    ax.plot([r["questions"] for r in rows], [r["seconds"] for r in rows], "o-")
    ax.axhline(1.0, color="grey", ls="--", lw=0.8)
    ax.set_xscale("log")
    ax.set_xlabel("questions (log)")
    ax.set_ylabel("seconds")
    ax.set_title(f"paired bootstrap, {METRICS * PAIRS} columns x {RESAMPLES:,} resamples", fontsize=9)
    fig.text(0.01, 0.01, cpu, fontsize=6, color="grey")
    fig.tight_layout()
    fig.savefig(OUT / "paired.png", dpi=120)
    print(f"wrote {OUT / 'paired.json'} and {OUT / 'paired.png'}")


if __name__ == "__main__":
    main()
