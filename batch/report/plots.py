"""Plots for run reports and model comparisons (matplotlib, Agg backend, no pyplot global state).

Every `*_png` function takes run tables and returns PNG bytes (or None when the table holds nothing
to plot), so `batch/report/html.py` can embed them as base64 in one self-contained HTML file.
`plot_compare` writes a PNG file: each metric against model size (parameter count, log x-axis).
"""

from __future__ import annotations

import io
import math
from pathlib import Path

import polars as pl

from clarify import schemas
from clarify.batch.toc.program import Step
from clarify.errors import InputError
from clarify.files import write_atomic

VALID_STATUSES = schemas.KEPT_STATUSES  # nodes counted as disambiguations
STEP_ORDER = tuple(s.value for s in Step)  # the order a tree makes its requests in (batch/toc/program.py)


def _figure(n_axes: int = 1, width: float = 5.2, height: float = 3.4):
    """A fresh Figure with `n_axes` side-by-side axes, drawn by the Agg canvas (no GUI, no pyplot)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width * n_axes, height), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    axes = [fig.add_subplot(1, n_axes, i + 1) for i in range(n_axes)]
    return fig, axes


def _png(fig) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()


def _integer_ticks(ax, x: bool = True, y: bool = True) -> None:
    """Whole-number ticks for counts (questions on y, unless a strip plot has no y scale; calls, depth,
    nodes on x)."""
    from matplotlib.ticker import MaxNLocator

    if y:
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    if x:
        lo, hi = (math.ceil(v) for v in ax.get_xlim())
        if hi - lo <= 20:  # few values: one tick per integer, even when there is only one
            ax.set_xticks(range(lo, hi))
        else:
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))


# A histogram needs enough questions to have a shape; below this many each question is a point (a strip plot).
HIST_FROM = 20


def _distribution(ax, values: list[float], color: str, *, integer: bool = False) -> str:
    """One value per question on `ax`: a histogram from HIST_FROM values, else one point per question (spread
    vertically so equal values stay visible). Returns the y-axis label."""
    if len(values) >= HIST_FROM:
        ax.hist(values, bins=_int_bins(values) if integer else min(20, len(values)), color=color, edgecolor="white")
        return "questions"
    spread = [((i * 7) % 11) / 10 - 0.5 for i in range(len(values))]  # fixed, not random: the same each time
    ax.scatter(values, spread, color=color, s=36, alpha=0.8, edgecolors="white")
    ax.set_ylim(-1, 1)
    ax.set_yticks([])
    return "one point per question"


def _int_bins(values: list[int]) -> list[float]:
    """Histogram bin edges centred on the integers from min to max."""
    lo, hi = min(values), max(values)
    return [v - 0.5 for v in range(lo, hi + 2)]


def llm_calls_png(llm_calls: pl.DataFrame) -> bytes | None:
    """LLM calls per question. In: llm_calls[qid, step, cached].

    Left: histogram of calls per question (all steps). Right: mean calls per question for each
    step, split into model calls and cache hits.
    """
    if llm_calls.height == 0:
        return None
    per_q = llm_calls.group_by("qid").len()["len"].to_list()
    n_q = llm_calls["qid"].n_unique()
    steps = sorted(llm_calls["step"].unique().to_list(), key=lambda s: (STEP_ORDER + (s,)).index(s))
    by_step = llm_calls.group_by("step", "cached").len()
    fig, (ax1, ax2) = _figure(2)
    ax1.set_ylabel(_distribution(ax1, per_q, "#4c72b0", integer=True))
    ax1.set_xlabel("LLM calls per question")
    ax1.set_title(f"calls per question (n={n_q}, mean {sum(per_q) / n_q:.1f})")
    _integer_ticks(ax1, y=len(per_q) >= HIST_FROM)
    bottoms = [0.0] * len(steps)
    for cached, colour, label in ((False, "#4c72b0", "model"), (True, "#a1c9f4", "cache hit")):
        heights = []
        for step in steps:
            row = by_step.filter((pl.col("step") == step) & (pl.col("cached") == cached))
            heights.append((row["len"][0] if row.height else 0) / n_q)
        ax2.bar(steps, heights, bottom=bottoms, color=colour, label=label)
        bottoms = [b + h for b, h in zip(bottoms, heights)]
    ax2.set_ylabel("mean calls per question")
    ax2.set_title("calls per question by step")
    ax2.legend()
    return _png(fig)


def tokens_png(llm_calls: pl.DataFrame) -> bytes | None:
    """Tokens. In: llm_calls[qid, step, prompt_tokens, output_tokens].

    Left: histogram of total tokens (prompt + output) per question. Right: prompt and output tokens
    per step, summed over the run.
    """
    if llm_calls.height == 0:
        return None
    calls = llm_calls.with_columns(pl.col("prompt_tokens", "output_tokens").fill_null(0))
    per_q = calls.group_by("qid").agg((pl.col("prompt_tokens") + pl.col("output_tokens")).sum().alias("t"))
    by_step = calls.group_by("step").agg(pl.col("prompt_tokens").sum(), pl.col("output_tokens").sum())
    steps = sorted(by_step["step"].to_list(), key=lambda s: (STEP_ORDER + (s,)).index(s))
    by_step = {r["step"]: r for r in by_step.iter_rows(named=True)}
    fig, (ax1, ax2) = _figure(2)
    ax1.set_ylabel(_distribution(ax1, per_q["t"].to_list(), "#55a868"))
    ax1.set_xlabel("tokens per question (prompt + output)")
    ax1.set_title(f"tokens per question (mean {per_q['t'].mean():.0f})")
    _integer_ticks(ax1, x=False, y=per_q.height >= HIST_FROM)
    xs = range(len(steps))
    ax2.bar([x - 0.2 for x in xs], [by_step[s]["prompt_tokens"] for s in steps], 0.4, label="prompt")
    ax2.bar([x + 0.2 for x in xs], [by_step[s]["output_tokens"] for s in steps], 0.4, label="output")
    ax2.set_xticks(list(xs), steps)
    ax2.set_ylabel("tokens (run total)")
    ax2.set_title("tokens by step")
    ax2.legend()
    return _png(fig)


def tree_shape(nodes: pl.DataFrame) -> pl.DataFrame:
    """Per-question tree shape. In: nodes[qid, depth, status]. Out: qid, max_depth, valid_nodes, nodes.

    valid_nodes counts statuses in VALID_STATUSES (the root is not a disambiguation).
    """
    return (
        nodes.group_by("qid")
        .agg(
            pl.col("depth").max().fill_null(0).alias("max_depth"),
            pl.col("status").is_in(VALID_STATUSES).sum().alias("valid_nodes"),
            pl.len().alias("nodes"),
        )
        .sort("qid")
    )


def tree_png(nodes: pl.DataFrame) -> bytes | None:
    """Tree depth and valid nodes per question (histograms, or points below HIST_FROM questions). In:
    nodes[qid, depth, status]."""
    if nodes.height == 0:
        return None
    shape = tree_shape(nodes)
    fig, (ax1, ax2) = _figure(2)
    depth = shape["max_depth"].to_list()
    valid = shape["valid_nodes"].to_list()
    ax1.set_ylabel(_distribution(ax1, depth, "#8172b2", integer=True))
    ax1.set_xlabel("tree depth (deepest node)")
    ax1.set_title(f"tree depth (n={shape.height})")
    ax2.set_ylabel(_distribution(ax2, valid, "#55a868", integer=True))
    ax2.set_xlabel("valid disambiguations")
    ax2.set_title(f"valid nodes per question (mean {sum(valid) / len(valid):.1f})")
    _integer_ticks(ax1, y=len(depth) >= HIST_FROM)
    _integer_ticks(ax2, y=len(valid) >= HIST_FROM)
    return _png(fig)


def scores_png(scores: pl.DataFrame) -> bytes | None:
    """Distribution of each per-question metric (a histogram from HIST_FROM questions, else one point per
    question). In: scores[qid, metric, value], metrics only (shape.per_question_metrics)."""
    scores = scores.drop_nulls("value").filter(pl.col("value").is_finite())
    if scores.height == 0:
        return None
    metrics = sorted(scores["metric"].unique().to_list())
    cols = min(3, len(metrics))
    rows = math.ceil(len(metrics) / cols)
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(4.2 * cols, 2.9 * rows), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    for i, metric in enumerate(metrics):
        ax = fig.add_subplot(rows, cols, i + 1)
        values = scores.filter(pl.col("metric") == metric)["value"].to_list()
        ax.set_ylabel(_distribution(ax, values, "#c44e52"), fontsize=8)
        mean = sum(values) / len(values)
        ax.axvline(mean, color="black", linestyle="--", linewidth=1)
        ax.set_title(f"{metric} (mean {mean:.3g}, n={len(values)})", fontsize=10)
        _integer_ticks(ax, x=False, y=len(values) >= HIST_FROM)
    return _png(fig)


def human_count(n: float) -> str:
    """135000000 -> '135M', 1.7e9 -> '1.7B'."""
    for div, unit in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "K")):
        if n >= div:
            return f"{n / div:.3g}{unit}"
    return f"{n:.3g}"


# The x axis of the comparison plot when a model's parameter count is unknown (a served model: its run
# reads no weights; a models file may give it, batch/compare/models_file.py `params`): the first cost every row has
# (batch/report/comparison.py cost_row), else the order of the runs.
SIZE_FALLBACKS = ("device_s_per_question", "wall_s_per_question")


def compare_x(table: pl.DataFrame) -> tuple[str, list[float], str, bool]:
    """What `compare_figure` plots the metrics against, for `table`'s rows in their order: (column or
    "run order", x of each row, axis label, log scale). The parameter count when every row has one, else
    the first of `SIZE_FALLBACKS` that every row has, else the run order (1, 2, ...); the label says which
    and why."""
    def known(col: str) -> list[float] | None:
        if col not in table.columns:
            return None
        xs = table[col].to_list()
        ok = all(isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x) and x > 0 for x in xs)
        return [float(x) for x in xs] if ok else None

    if (xs := known("params")) is not None:
        return "params", xs, "parameters (log scale)", True
    unknown = [Path(str(m)).name or str(m) for m, p in zip(table["model"].to_list(), table["params"].to_list())
               if not (isinstance(p, int | float) and p > 0)]
    # short, so that the panel keeps its width (a long label squeezes it: matplotlib's constrained layout)
    why = ("no parameter count for " + " and ".join(unknown) if len(unknown) <= 2 and sum(map(len, unknown)) <= 30
           else f"{len(unknown)} of {table.height} models without a parameter count")
    for col in SIZE_FALLBACKS:
        if (xs := known(col)) is not None:
            words = col.replace("_s_per_", "-seconds per ").replace("_", " ")
            return col, xs, f"{words} (log scale; {why})", True
    return "run order", [float(i) for i in range(1, table.height + 1)], f"run order ({why})", False


def compare_figure(table: pl.DataFrame, metrics: list[str] | None = None):
    """Figure with one panel per metric: metric value against parameter count (log x), one point per model.

    In: table[model, params, <metric columns...>]; `metrics` defaults to every numeric column
    other than params. When a row's params is null or non-positive (a served model), every panel is drawn
    against a cost the rows all have, or the run order, instead (`compare_x`; the axis label says which):
    every model stays in the plot.
    """
    for col in ("model", "params"):
        if col not in table.columns:
            raise InputError(f"comparison table lacks column '{col}'; it has {table.columns}", field=col)
    if metrics is None:
        metrics = [c for c, t in table.schema.items() if c not in ("model", "params") and t.is_numeric()]
    # a metric's empty-answer floor (`<metric>_empty`) is drawn inside that metric's panel, not as its own
    metrics = [m for m in metrics if not (m.endswith("_empty") and m.removesuffix("_empty") in metrics)]
    if not metrics:
        raise InputError("comparison table has no numeric metric columns", field="metrics")
    if table.height == 0:
        raise InputError("the comparison table has no row", field="model")
    x_col, x_all, xlabel, log = compare_x(table)
    order = sorted(range(table.height), key=lambda i: x_all[i])
    rows = table[order]
    xs_sorted = [x_all[i] for i in order]
    cols = min(3, len(metrics))
    n_rows = math.ceil(len(metrics) / cols)
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(4.2 * cols, 3.2 * n_rows), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    # a model given as a folder is labelled by the folder's name: a whole path as a label squeezes the
    # panels to nothing (matplotlib's constrained layout gives up)
    names = [Path(str(m)).name or str(m) for m in rows["model"].to_list()]
    for i, metric in enumerate(metrics):
        ax = fig.add_subplot(n_rows, cols, i + 1)
        ys = rows[metric].to_list()
        pts = [(x, y, n) for x, y, n in zip(xs_sorted, ys, names) if y is not None and math.isfinite(y)]
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", color="#4c72b0")
        floor = f"{metric}_empty"  # what an empty answer scores on the same questions (eval/quotesum.py)
        if floor in rows.columns and rows[floor].drop_nulls().len():
            level = float(rows[floor].drop_nulls().mean())
            ax.axhline(level, color="#999999", linestyle="--", linewidth=1)
            ax.annotate("empty answer", (0.02, level), xycoords=("axes fraction", "data"),
                        textcoords="offset points", xytext=(0, 3), fontsize=7, color="#666666")
        for j, (x, y, n) in enumerate(pts):
            right = j == len(pts) - 1 and len(pts) > 1  # keep the last label inside the axes
            ax.annotate(
                n,
                (x, y),
                textcoords="offset points",
                xytext=(-4 if right else 4, 4 if j % 2 == 0 else -11),  # alternate: equal values don't overlap
                ha="right" if right else "left",
                fontsize=7,
            )
        from matplotlib.ticker import NullLocator

        lo, hi = min(xs_sorted), max(xs_sorted)
        if log:
            ax.set_xscale("log")
            # Label the models' own values; log minor-tick labels overlap when they span < 1 decade.
            ax.xaxis.set_minor_locator(NullLocator())
            ticks = sorted(set(xs_sorted))
            ax.set_xticks(ticks, [human_count(p) if x_col == "params" else f"{p:.3g}" for p in ticks])
            ax.set_xlim(lo / 1.5, hi * 1.5)
        else:  # the run order: one tick per run
            ax.set_xticks(xs_sorted, [str(int(x)) for x in xs_sorted])
            ax.set_xlim(lo - 0.5, hi + 0.5)
        ax.set_xlabel(xlabel, **({"fontsize": 8} if len(xlabel) > 30 else {}))
        ax.set_title(metric, fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
    return fig


def compare_png(table: pl.DataFrame, metrics: list[str] | None = None) -> bytes:
    """`compare_figure(table, metrics)` as PNG bytes (the report embeds it)."""
    return _png(compare_figure(table, metrics))


def plot_compare(table: pl.DataFrame, out_png: Path | str, metrics: list[str] | None = None) -> Path:
    """Write `compare_figure(table, metrics)` to `out_png` and return its path.

    In: table[model, params, <metric columns...>] (one row per model/run).
    """
    fig = compare_figure(table, metrics)
    return write_atomic(out_png, lambda tmp: fig.savefig(tmp, format="png"))
