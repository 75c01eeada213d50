"""Corpus-level summaries of per-question score tables, and the long `scores` table (schemas.SCORES).

Aggregation follows the official scorers:
- ROUGE columns (`rouge_l`, `rouge1`, `rouge2`): rouge-score BootstrapAggregator mid (1000 resamples;
  asqa/scoring.py::_rouge_calculation, QuoteSum scorers.py::score_all with seed 1337) — `bootstrap_mid`;
- every other metric: the mean over questions (asqa/scoring.py::str_em, score_qa_accuracy,
  QuoteSum scorers.py::score_semqa_f1 / score_semqa_short_recall); nulls are skipped and `n` says how many
  questions the value covers;
- DR = sqrt(D-F1 × ROUGE-L) (asqa/scoring.py::compute_all_scores "ovscore") and
  SEMQA = sqrt(Sem-F1 × ROUGE-L) (QuoteSum evals/semqa_metrics.ipynb), both from the corpus values.
A metric that could not be computed has a null value and a note saying why — never 0.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import polars as pl

from clarify import schemas
from clarify.eval.asqa import NO_READER, READER_METRICS
from clarify.eval.metrics import Metric
from clarify.eval.rouge import bootstrap_mid

ROUGE_COLUMNS = (Metric.ROUGE_L, Metric.ROUGE1, Metric.ROUGE2)
# Columns that are bookkeeping, not metrics.
NON_METRICS = {"qid", "ref_id", "n_pairs", "n_refs", "n_predicted", "n_gold", "missing"}
# Why a metric column can be entirely null.
DEFAULT_NOTES = dict.fromkeys(READER_METRICS, NO_READER)
DERIVED = {Metric.DR: (Metric.D_F1, Metric.ROUGE_L), Metric.SEMQA: (Metric.SEM_F1, Metric.ROUGE_L)}


def metric_columns(per_question: pl.DataFrame) -> list[str]:
    """The numeric metric columns of a per-question table."""
    return [c for c, t in per_question.schema.items() if c not in NON_METRICS and t.is_numeric()]


def summarize(per_question: pl.DataFrame, notes: dict[str, str] | None = None) -> pl.DataFrame:
    """One row per metric: [metric, value, n, note].

    per_question: a table from score_asqa / score_quotesum / answer_f1 (qid + one column per metric;
    an optional boolean `missing` column adds a `missing_predictions` row).
    notes: reasons for metrics that are entirely null (defaults: the no-reader reason for D-F1).
    """
    notes = {**DEFAULT_NOTES, **(notes or {})}
    rows: list[dict] = []
    values: dict[str, float | None] = {}
    for col in metric_columns(per_question):
        s = per_question[col].cast(pl.Float64).fill_nan(None)
        n = s.len() - s.null_count()
        if n == 0:
            values[col] = None
            rows.append({"metric": col, "value": None, "n": 0, "note": notes.get(col, "not computed")})
            continue
        if col in ROUGE_COLUMNS:
            v = bootstrap_mid(s.drop_nulls().to_list())
            note = f"bootstrap mid (1000 resamples, seed 1337) as the official scorer; mean {s.mean():.4f}"
        else:
            v, note = float(s.mean()), None
        values[col] = v
        rows.append({"metric": col, "value": v, "n": n, "note": note})
    for name, (a, b) in DERIVED.items():
        if a not in values or b not in values:
            continue
        if values[a] is None or values[b] is None:
            missing = a if values[a] is None else b
            rows.append({"metric": name, "value": None, "n": 0,
                         "note": f"needs {missing}: " + notes.get(missing, "not computed")})
        else:
            rows.append({"metric": name, "value": math.sqrt(values[a] * values[b]),
                         "n": min(r["n"] for r in rows if r["metric"] in (a, b)),
                         "note": f"sqrt({a} x {b}) of the corpus values"})
    if "missing" in per_question.columns:
        rows.append({"metric": Metric.MISSING_PREDICTIONS, "value": float(per_question["missing"].sum()),
                     "n": per_question.height, "note": "ids without a prediction, scored as empty answers"})
    return pl.DataFrame(rows, schema=schemas.METRICS)


def to_scores(per_question: pl.DataFrame) -> pl.DataFrame:
    """The long `scores` table (schemas.SCORES: qid, metric, value); null (not computed) values are dropped."""
    cols = metric_columns(per_question)
    long = (
        per_question.select(["qid", *cols])
        .with_columns(pl.col(c).cast(pl.Float64) for c in cols)
        .unpivot(index="qid", variable_name="metric", value_name="value")
        .drop_nulls("value")
        .filter(pl.col("value").is_not_nan())
    )
    return schemas.conform(long, "scores")


@dataclass(frozen=True)
class Scored:
    """Predictions scored (`score_predictions`)."""

    per_question: pl.DataFrame  # qid + one column per metric (and bookkeeping such as n_pairs, missing)
    scores: pl.DataFrame  # schemas.SCORES, `to_scores`
    summary: pl.DataFrame  # schemas.METRICS, the dataset's `summarize`

    @property
    def metrics(self) -> dict[str, float | None]:
        """The summary as {metric: value} (summary.json `metrics`)."""
        return {r["metric"]: r["value"] for r in self.summary.iter_rows(named=True)}

    @property
    def notes(self) -> dict[str, str]:
        """Each metric's note, where it has one (summary.json `metric_notes`)."""
        return {r["metric"]: r["note"] for r in self.summary.iter_rows(named=True) if r["note"]}


def score_predictions(ds: Any, predictions: pl.DataFrame, gold: pl.DataFrame, *,
                      nodes: pl.DataFrame | None = None, reader: Any = None) -> Scored:
    """`ds`: the dataset (eval/datasets/ `Dataset`, which imports this module). The one way from predictions
    [qid, answer] (+ `missing`) to the per-question table, the long `scores`
    table and the summary: `clarify run` (its scores.parquet and summary.json metrics) and `clarify eval`
    (per_question, scores and summary.parquet) both call it, so the same answers give the same tables."""
    per_q = ds.score(predictions, gold, nodes=nodes, reader=reader)
    return Scored(per_q, to_scores(per_q), ds.summarize(per_q, gold))


def format_table(summary: pl.DataFrame) -> str:
    """A plain-text table of a summary, for the terminal."""
    lines = [f"{'metric':<22}{'value':>10}{'n':>7}  note"]
    for r in summary.iter_rows(named=True):
        val = "—" if r["value"] is None else f"{r['value']:.3f}"
        lines.append(f"{r['metric']:<22}{val:>10}{r['n']:>7}  {r['note'] or ''}")
    return "\n".join(lines)
