"""QuoteSum / SEMQA metrics (Schuster et al. 2023) as google-research-datasets/QuoteSum `evals/` scores them.

Quoted answers mark every copied span as `[ k span ]` — with the spaces — where k (1–9) is the source
number. The official regex (evals/scorers.py::strip_attribution_tokens, only_quoted) is
`\\[ ([1-9]) ([^\\[\\]]*) \\]`, so anything else is *not* a marker and stays in the text as written:
`[1 span]` (no spaces), `[ 12 x ]` (two digits), an unclosed `[ 1 x`, and the outer brackets of a nested
`[ 1 a [ 2 b ] c ]` (only the inner `[ 2 b ]` is a marker). `canonical_markers` rewrites the common
`[k span]` spelling into the official one for callers who want it (off by default).

Per question (0–100):
- `rouge_l` (+ `rouge1`, `rouge2`) — rouge-score rougeLsum without stemmer on marker-stripped text, best
  reference by rougeLsum F (scorers.py::score_all_rouge; corpus value = bootstrap mid, in summarize);
- `sem_f1` — for each source k = 1..7 present in the question, token F1 (QuoteSum normalisation) between
  the prediction's spans marked k and each reference's, max over references (each of F1/P/R maxed
  independently), then mean over the present sources (scorers.py::score_semqa_f1);
- `sem_rec` — recall of each reference's `covered_short_answers` spans marked k within the prediction's
  spans marked k, max over references, mean over the sources some reference has short answers for;
  null when every reference's covered_short_answers is empty (scorers.py::score_semqa_short_recall).
SEMQA = sqrt(Sem-F1 × ROUGE-L) at corpus level (evals/semqa_metrics.ipynb), in summarize.

Also here: the one reader of QuoteSum files (`read_quotesum`: the tables of `load_quotesum` and the SEMQA
demos of eval/datasets/quotesum.py).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import polars as pl

from clarify import schemas
from clarify.errors import InputError
from clarify.eval.io import check_prediction_ids
from clarify.eval.metrics import Metric
from clarify.eval.rouge import quotesum_scorer
from clarify.jsonl import iter_jsonl
from clarify.normalize import normalize_answer_quotesum, prf_tokens

MARKER = re.compile(r"\[ ([1-9]) ([^\[\]]*) \]")  # scorers.py::strip_attribution_tokens / non_quoted
SEM_SOURCES = range(1, 8)  # scorers.py::score_semqa_f1 / score_semqa_short_recall loop over sources 1..7
MAX_SOURCES = 8  # QuoteSum rows carry source1..source8

GOLD_SCHEMA = schemas.QUOTESUM_GOLD


# ---------------------------------------------------------------- markers


def strip_markers(text: str) -> str:
    """Replace every official marker by its span text (scorers.py::strip_attribution_tokens)."""
    return MARKER.sub(r"\2", text)


def non_quoted(text: str) -> str:
    """The text outside official markers (scorers.py::non_quoted)."""
    return MARKER.sub("", text)


def quoted_text(text: str, source: int, sep: str = " ") -> str:
    """Spans marked with `source`, joined by `sep` (scorers.py::only_quoted with sources=str(source))."""
    return sep.join(m.group(2) for m in MARKER.finditer(text) if m.group(1) == str(source))


def quoted_sources(text: str) -> list[int]:
    """Sorted distinct source numbers quoted in `text` (scorers.py::quoted_sources)."""
    return sorted({int(m.group(1)) for m in MARKER.finditer(text)})


# ` ++` is possessive (Python 3.11 re): a plain ` +` gave spaces back to the lazy span one at a time,
# each retry rescanning to the next bracket: quadratic, 16.8 s for "[ 1" and 40k spaces. Giving spaces
# back never made a match (the span then fails at the same bracket or end), so the matches are the same
# (tests/test_parse_linear.py compares them on random text).
_LOOSE = re.compile(r"\[ ?([1-9]) ++([^\[\]]*?) ?\]")


def canonical_markers(text: str) -> str:
    """Rewrite loosely spaced markers (`[1 span]`, `[ 1 span]`) into the official `[ 1 span ]`."""
    return _LOOSE.sub(lambda m: f"[ {m.group(1)} {m.group(2).strip()} ]", text)


# ---------------------------------------------------------------- per-string metrics


def _source_tokens(text: str, source: int) -> list[str]:
    # scorers.py::preprocess_quotes_f1: only_quoted(sep=' ') then normalize_answer, split on spaces.
    return normalize_answer_quotesum(quoted_text(text, source)).split()


def rouge_scores(prediction: str, references: Sequence[str]) -> dict[str, float]:
    """rouge1/rouge2/rougeLsum F ×100 of the reference that maximises rougeLsum (scorers.py::score_all)."""
    scorer = quotesum_scorer()
    pred = strip_markers(prediction)
    best = max((scorer.score(strip_markers(ref), pred) for ref in references),
               key=lambda s: s["rougeLsum"].fmeasure)
    return {Metric.ROUGE_L: 100 * best["rougeLsum"].fmeasure, Metric.ROUGE1: 100 * best["rouge1"].fmeasure,
            Metric.ROUGE2: 100 * best["rouge2"].fmeasure}


def sem_f1(prediction: str, references: Sequence[str], sources_present: Sequence[int]) -> float:
    """Sem-F1 ×100 of one prediction (scorers.py::score_semqa_f1, aggr_measure='independent').

    For each present source k ≤ 7: max over references of the token F1 between the spans marked k
    (both sides empty → 1, one side empty → 0); mean over present sources.
    """
    ks = [k for k in SEM_SOURCES if k in set(sources_present)]
    if not ks:
        return float("nan")
    total = 0.0
    for k in ks:
        pred = _source_tokens(prediction, k)
        total += max(prf_tokens(_source_tokens(ref, k), pred)[0] for ref in references)
    return 100.0 * total / len(ks)


def sem_rec(prediction: str, short_references: Sequence[str]) -> float | None:
    """Sem-Rec ×100 of one prediction (scorers.py::score_semqa_short_recall), None when not defined.

    Not defined when every reference's covered_short_answers is "" (the scorer skips the question) or no
    source has a non-empty short answer. Otherwise, for each source k ≤ 7 that some reference has short
    answers for: max over *all* references of recall(reference spans k, prediction spans k) — a reference
    with nothing marked k has recall 1 by the scorer's convention — and mean over those sources.
    """
    if not short_references or all(r == "" for r in short_references):
        return None
    recalls = []
    for k in SEM_SOURCES:
        targets = [_source_tokens(r, k) for r in short_references]
        if not any(targets):
            continue
        pred = _source_tokens(prediction, k)
        recalls.append(max(prf_tokens(t, pred)[1] for t in targets))
    if not recalls:
        return None
    return 100.0 * sum(recalls) / len(recalls)


# ---------------------------------------------------------------- loading


@dataclass(frozen=True)
class Row:
    """One line of a QuoteSum JSONL file: one reference answer of a question (several lines share a qid)."""

    qid: str
    question: str
    summary: str  # the reference answer, with `[ k span ]` markers
    covered_short_answers: str
    ref_id: str  # unique_id, else qid_<row number>
    titles: tuple[str, ...]  # of the non-empty sources: source k is sources[k - 1]
    sources: tuple[str, ...]


def read_quotesum(path: str | Path) -> tuple[Row, ...]:
    """Every line of a QuoteSum JSONL file, in file order: the one reader of QuoteSum files (the tables of
    `load_quotesum`, the SEMQA demos of eval/datasets/quotesum.py `QuoteSum.demos`). A bad line is an
    InputError naming the file, the line and the field."""
    path = Path(path)
    rows: list[Row] = []
    for line_no, rec in iter_jsonl(path, wording={"bad_json": "bad JSON"}):
        for field in ("qid", "question", "summary"):
            if not isinstance(rec.get(field), str):
                raise InputError("missing or non-string field", path=str(path), line=line_no, field=field)
        sources = [rec.get(f"source{k}") or "" for k in range(1, MAX_SOURCES + 1)]
        titles = [rec.get(f"title{k}") or "" for k in range(1, MAX_SOURCES + 1)]
        present = [k for k in range(1, MAX_SOURCES + 1) if sources[k - 1]]
        if not present:
            raise InputError("a QuoteSum row needs at least source1", path=str(path), line=line_no, field="source1")
        if present != list(range(1, len(present) + 1)):
            raise InputError(f"sources must be numbered 1..n without gaps, got {present}", path=str(path), line=line_no)
        rows.append(Row(rec["qid"], rec["question"], rec["summary"], rec.get("covered_short_answers") or "",
                        str(rec.get("unique_id") or f"{rec['qid']}_{len(rows)}"), tuple(titles[: len(present)]),
                        tuple(sources[: len(present)])))
    if not rows:  # every line blank
        raise InputError("file is empty", path=str(path))
    return tuple(rows)


def load_quotesum(path: str | Path) -> tuple[pl.DataFrame, pl.DataFrame]:
    """A QuoteSum JSONL file (`read_quotesum`) as tables.

    Returns
      questions: [qid, question, dataset="quotesum", sources: list[str], titles: list[str]] — one row per
                 qid (its first line), sources/titles are the non-empty source1.. in order (k = position + 1);
      gold:      one row per reference: [qid, ref_id (unique_id), summary, covered_short_answers,
                 sources_present: list[int] (the k with a non-empty source)].
    """
    q_rows: dict[str, dict] = {}
    g_rows = []
    for row in read_quotesum(path):
        q_rows.setdefault(row.qid, {"qid": row.qid, "question": row.question, "dataset": "quotesum",
                                    "sources": list(row.sources), "titles": list(row.titles)})
        g_rows.append({"qid": row.qid, "ref_id": row.ref_id, "summary": row.summary,
                       "covered_short_answers": row.covered_short_answers,
                       "sources_present": list(range(1, len(row.sources) + 1))})
    questions = pl.DataFrame(list(q_rows.values()), schema={**schemas.QUESTIONS, "sources": pl.List(pl.String),
                                                           "titles": pl.List(pl.String)})
    return questions, pl.DataFrame(g_rows, schema=GOLD_SCHEMA)


# ---------------------------------------------------------------- tables

SCORE_SCHEMA = {
    "qid": pl.String, **dict.fromkeys((Metric.ROUGE_L, Metric.ROUGE1, Metric.ROUGE2, Metric.SEM_F1, Metric.SEM_REC),
                                      pl.Float64), "n_refs": pl.Int32, "missing": pl.Boolean,
}


def _score_one(qid: str, prediction: str, refs: Sequence[dict], missing: bool) -> dict:
    summaries = [r["summary"] for r in refs]
    return {
        "qid": qid,
        **rouge_scores(prediction, summaries),
        # scorers.py::score_semqa_f1 reads the sources of the qid's first row.
        Metric.SEM_F1: sem_f1(prediction, summaries, refs[0]["sources_present"]),
        Metric.SEM_REC: sem_rec(prediction, [r["covered_short_answers"] for r in refs]),
        "n_refs": len(refs),
        "missing": missing,
    }


def score_quotesum(predictions: pl.DataFrame, gold: pl.DataFrame, *, progress: bool = True) -> pl.DataFrame:
    """Score quoted answers against every reference of their qid.

    predictions: [qid, answer] (+ optional `missing` bool; null answer = ""). gold: from `load_quotesum`.
    Returns [qid, rouge_l, rouge1, rouge2, sem_f1, sem_rec, n_refs, missing]. InputError for unknown or
    duplicated qids.
    """
    from tqdm import tqdm

    schemas.check(predictions, "answers", columns=["qid", "answer"])
    refs_by = _refs_by_qid(gold)
    check_prediction_ids(predictions, set(refs_by))
    preds = predictions.with_columns(pl.col("answer").fill_null(""))
    missing = preds["missing"].to_list() if "missing" in preds.columns else [False] * preds.height
    rows = [
        _score_one(qid, answer, refs_by[qid], bool(miss))
        for (qid, answer), miss in tqdm(zip(preds.select("qid", "answer").iter_rows(), missing),
                                        total=preds.height, desc="quotesum", unit="q",
                                        disable=not progress or None)
    ]
    return pl.DataFrame(rows, schema=SCORE_SCHEMA)


def score_human_holdout(gold: pl.DataFrame, *, progress: bool = True) -> pl.DataFrame:
    """Human performance: each reference scored as a prediction against the *other* references of its qid.

    Questions with a single reference have nothing to compare with and are left out.
    Returns SCORE_SCHEMA columns plus ref_id (the held-out reference), one row per held-out reference.
    """
    from tqdm import tqdm

    rows = []
    for qid, refs in tqdm(_refs_by_qid(gold).items(), desc="holdout", unit="q", disable=not progress or None):
        if len(refs) < 2:
            continue
        for i, held in enumerate(refs):
            others = refs[:i] + refs[i + 1 :]
            rows.append({**_score_one(qid, held["summary"], others, False), "ref_id": held["ref_id"]})
    return pl.DataFrame(rows, schema={**SCORE_SCHEMA, "ref_id": pl.String})


def _refs_by_qid(gold: pl.DataFrame) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for r in gold.iter_rows(named=True):
        out.setdefault(r["qid"], []).append(r)
    return out


def empty_answer_floor(qids: Sequence[str], gold: pl.DataFrame) -> pl.DataFrame:
    """Summary rows for what an *empty* answer scores on the same questions: `sem_f1_empty`, `sem_rec_empty`.

    The official Sem-F1 gives 1 to a source that neither the prediction nor the reference quotes, and
    Sem-Rec gives recall 1 to a reference with no short answer marked k, so a model that quotes nothing
    still earns these (about 39 and 40 on QuoteSum dev). Reported next to the real values so a reader can
    tell quoting skill from the scorer's credit. Rows follow schemas.METRICS.
    """

    refs_by = _refs_by_qid(gold)
    refs = [refs_by[q] for q in qids if q in refs_by]
    values = {  # as _score_one scores the prediction "" (no ROUGE needed)
        Metric.SEM_F1: [sem_f1("", [r["summary"] for r in rs], rs[0]["sources_present"]) for rs in refs],
        Metric.SEM_REC: [sem_rec("", [r["covered_short_answers"] for r in rs]) for rs in refs],
    }
    rows = []
    for metric, raw in values.items():
        vals = [v for v in raw if v is not None and v == v]  # None / NaN: not defined for that question
        rows.append({"metric": f"{metric}_empty", "value": sum(vals) / len(vals) if vals else None, "n": len(vals),
                     "note": f"{metric} of an empty answer on these questions (the scorer's credit for "
                             "sources nobody quotes)"})
    return pl.DataFrame(rows, schema=schemas.METRICS)


def summarize_quotesum(per_question: pl.DataFrame, gold: pl.DataFrame,
                       notes: dict[str, str] | None = None) -> pl.DataFrame:
    """`eval.summary.summarize` of a `score_quotesum` table, plus its empty-answer floor rows."""
    from clarify.eval.summary import summarize

    return pl.concat([summarize(per_question, notes), empty_answer_floor(per_question["qid"].to_list(), gold)])
