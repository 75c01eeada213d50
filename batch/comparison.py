"""The comparison of runs in `clarify report` (DESIGN §8): one row per run, pure functions over loaded runs.

A loaded run here is anything with the attributes `LoadedRun` names (`report.load_run` returns one); the
rendering in `batch/report.py` turns the table into HTML and the metric-vs-size plot (`plots.compare_figure`).
"""

from __future__ import annotations

import json
import math
from typing import Protocol

import polars as pl


class LoadedRun(Protocol):
    """What the comparison reads of a run: its name, config.json, summary.json and tables."""

    name: str
    config: dict
    summary: dict
    questions: pl.DataFrame
    llm_calls: pl.DataFrame


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


def model_params(run: LoadedRun) -> float | None:
    """Parameter count of the run's model: summary `params`/`model_params`, else the same keys in config."""
    for source in (run.summary, run.config):
        for key in ("params", "model_params", "n_params"):
            value = source.get(key)
            if isinstance(value, int | float) and not isinstance(value, bool) and value > 0:
                return float(value)
    return None


def model_name(run: LoadedRun) -> str | None:
    """The run's model: summary `model`, else config `model` (a run's config holds the `[model]` table)."""
    value = run.summary.get("model") or run.config.get("model")
    if isinstance(value, dict):
        value = value.get("model")
    return None if value is None else str(value)


def summary_row(run: LoadedRun) -> dict:
    """One comparison row: run, model, dataset, questions, params, metrics (bare names), the rest of
    summary.json flattened with dots, and llm_calls_per_question / model_calls_per_question computed
    from llm_calls (model_calls = calls not answered from the cache)."""
    n_q = run.questions["qid"].n_unique() or run.llm_calls["qid"].n_unique()
    row: dict = {
        "run": run.name,
        "model": model_name(run),
        "dataset": run.config.get("dataset"),
        "questions": n_q,
        "params": model_params(run),
    }
    summary = dict(run.summary)
    metrics = summary.pop("metrics", {}) or {}
    row.update({k: v for k, v in flatten(metrics).items()})
    row.update(
        {k: v for k, v in flatten(summary).items() if k not in row and k not in ("params", "model_params")}
    )
    calls = run.llm_calls
    row["llm_calls_per_question"] = calls.height / n_q if n_q else None
    row["model_calls_per_question"] = (
        calls.filter(~pl.col("cached").fill_null(False)).height / n_q if n_q else None
    )
    return row


def comparison_table(runs: list[LoadedRun]) -> pl.DataFrame:
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


def plotted_metrics(runs: list[LoadedRun], table: pl.DataFrame) -> list[str]:
    """Columns of `table` worth plotting against model size: the quality metrics plus cost per question
    (raw totals depend on the question count), numeric ones only."""
    names: list[str] = []
    for run in runs:
        names += [m for m in flatten(run.summary.get("metrics") or {}) if m not in names]
    return [
        c
        for c in [*names, "llm_calls_per_question", "wall_s"]
        if c in table.columns and table.schema[c] == pl.Float64
    ]
