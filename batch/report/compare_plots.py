"""Plots of runs compared question by question (batch/report/comparison.py `paired_table`, `cost_table`):
a forest plot per metric (each pair's mean difference with its 95 % paired-bootstrap interval) and
quality against cost (one point per model). PNG bytes, drawn as batch/report/plots.py draws its own."""

from __future__ import annotations

import math

import polars as pl

from clarify.batch.report.plots import _figure, _png

SIGNIFICANT = "#c44e52"  # a difference that survives Holm-Bonferroni (comparison.paired_rows `significant`)
NOT_SIGNIFICANT = "#4c72b0"


def forest_png(paired: pl.DataFrame) -> bytes | None:
    """One panel per metric, one row per pair (b − a): the mean difference as a point, its interval as a
    bar, a line at 0; a difference that survives Holm-Bonferroni is drawn filled in red and starred. Rows
    on too few questions for an interval (eval/paired.py MIN_N) are left out; None when none is left."""
    paired = paired.filter(pl.col("ci_low").is_not_null())
    if paired.height == 0:
        return None
    metrics = paired["metric"].unique(maintain_order=True).to_list()
    cols = min(3, len(metrics))
    n_rows = math.ceil(len(metrics) / cols)
    pairs = paired.select("a", "b").unique(maintain_order=True).rows()
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(4.2 * cols, 0.3 + (0.45 * len(pairs) + 1.9) * n_rows), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    labels = [f"{b} − {a}" for a, b in pairs]
    for i, metric in enumerate(metrics):
        ax = fig.add_subplot(n_rows, cols, i + 1)
        rows = {(r["a"], r["b"]): r for r in paired.filter(pl.col("metric") == metric).iter_rows(named=True)}
        for y, pair in enumerate(pairs):
            r = rows.get(pair)
            if r is None:
                continue
            color = SIGNIFICANT if r["significant"] else NOT_SIGNIFICANT
            ax.plot([r["ci_low"], r["ci_high"]], [y, y], color=color, linewidth=2)
            ax.plot([r["diff"]], [y], marker="o", color=color, markerfacecolor=color if r["significant"] else "white")
            if r["significant"]:
                ax.annotate("*", (r["ci_high"], y), textcoords="offset points", xytext=(3, -4), color=color)
        ax.axvline(0, color="#999999", linestyle="--", linewidth=1)
        ax.set_yticks(range(len(pairs)), labels if i % cols == 0 else [""] * len(pairs), fontsize=7)
        ax.set_ylim(len(pairs) - 0.5, -0.5)
        ax.set_title(metric, fontsize=10)
        ax.set_xlabel("mean difference, 95 % CI", fontsize=8)
        ax.grid(True, axis="x", alpha=0.3)
    return _png(fig)


def quality_cost_png(table: pl.DataFrame, metric: str, cost: str = "device_s_per_question") -> bytes | None:
    """`metric` against `cost` (log x), one labelled point per run. In: table[run, <metric>, <cost>]."""
    if metric not in table.columns or cost not in table.columns:
        return None
    pts = [(r[cost], r[metric], r["run"]) for r in table.iter_rows(named=True)
           if isinstance(r[cost], int | float) and r[cost] > 0 and isinstance(r[metric], int | float)]
    if not pts:
        return None
    fig, (ax,) = _figure()
    for x, y, name in pts:
        ax.plot([x], [y], marker="o", color=NOT_SIGNIFICANT)
        ax.annotate(name, (x, y), textcoords="offset points", xytext=(4, 4), fontsize=7)
    ax.set_xscale("log")
    xs = [p[0] for p in pts]
    ax.set_xlim(min(xs) / 1.6, max(xs) * 1.6)
    ax.set_xlabel(cost.replace("_s_", "-seconds ").replace("_", " ") + " (log)")
    ax.set_ylabel(metric)
    ax.set_title(f"{metric} against cost", fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    return _png(fig)
