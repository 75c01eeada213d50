"""The comparison of runs in `clarify report` (docs/architecture.md#reports-and-comparisons): one row per run, pure functions over loaded runs.

The runs are read by the one run reader (`batch/rundir.py` Run.open); the rendering in `batch/report/html.py`
turns the table into HTML and the metric-vs-size plot (`plots.compare_png`).
"""

from __future__ import annotations

import json
import math

import polars as pl

from clarify.batch.rundir import Run


def flatten(d: dict, prefix: str = "") -> dict:
    """Nested dicts as one level, keys joined with dots (`{"toc": {"max_depth": 3}}` → `toc.max_depth`)."""
    out = {}
    for key, value in d.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(flatten(value, name + "."))
        else:
            out[name] = value
    return out


def split_summary(summary: dict) -> tuple[dict, dict]:
    """summary.json as (its metrics, everything else), each flattened with dots (`flatten`)."""
    rest = dict(summary)
    metrics = rest.pop("metrics", {}) or {}
    return flatten(metrics), flatten(rest)


def fmt(value: object) -> str:
    """A table cell's text: 4 significant digits for floats, JSON for lists and dicts, — for null."""
    if isinstance(value, bool) or value is None:
        return "—" if value is None else str(value).lower()
    if isinstance(value, float):
        if not math.isfinite(value):
            return str(value)
        return f"{value:.4g}" if abs(value) < 1e6 else f"{value:.3e}"
    if isinstance(value, list | tuple | dict):
        return json.dumps(value, ensure_ascii=False)
    return str(value)


def model_params(run: Run) -> float | None:
    """Parameter count of the run's model (summary `params`, read from the model's files by the run)."""
    value = run.summary.get("params")
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) and value > 0 else None


def summary_row(run: Run) -> dict:
    """One comparison row: run, model, dataset, questions, params, metrics (bare names), the rest of
    summary.json flattened with dots, and llm_calls_per_question / model_calls_per_question computed
    from llm_calls (model_calls = calls not answered from the cache)."""
    n_q = run.questions["qid"].n_unique()
    row: dict = {
        "run": run.name,
        "model": run.config.model.model,
        "dataset": run.config.dataset,
        "questions": n_q,
        "params": model_params(run),
    }
    metrics, rest = split_summary(run.summary)
    row.update(metrics)
    row.update({k: v for k, v in rest.items() if k not in row and k != "params"})
    calls = run.llm_calls
    row["llm_calls_per_question"] = calls.height / n_q if n_q else None
    row["model_calls_per_question"] = (
        calls.filter(~pl.col("cached").fill_null(False)).height / n_q if n_q else None
    )
    return row


def comparison_table(runs: list[Run]) -> pl.DataFrame:
    """One row per run (see `summary_row`); columns are the union over runs (missing → null)."""
    rows = [summary_row(r) for r in runs]
    columns: list[str] = []
    for row in rows:
        columns += [c for c in row if c not in columns]
    data = {c: [r.get(c) for r in rows] for c in columns}
    series = []
    for c, values in data.items():
        scalars = [v for v in values if v is not None]
        if scalars and all(isinstance(v, int | float) and not isinstance(v, bool) for v in scalars):
            series.append(pl.Series(c, [float(v) if v is not None else None for v in values], pl.Float64))
        else:
            series.append(pl.Series(c, [None if v is None else fmt(v) for v in values], pl.String))
    return pl.DataFrame(series)


def plotted_metrics(runs: list[Run], table: pl.DataFrame) -> list[str]:
    """Columns of `table` worth plotting against model size: the quality metrics plus cost per question
    (raw totals depend on the question count), numeric ones only."""
    names: list[str] = []
    for run in runs:
        names += [m for m in split_summary(run.summary)[0] if m not in names]
    return [
        c
        for c in [*names, "llm_calls_per_question", "wall_s"]
        if c in table.columns and table.schema[c] == pl.Float64
    ]
