"""The tables that carry clarify's data from stage to stage (docs/architecture.md#tables-are-the-interface).

Every stage takes and returns Polars DataFrames with one of the schemas below. Long tables, one row
per thing, ids as strings spelled the same everywhere (`qid`, `node_id`, `passage_id`).
A stage calls `check(df, "hits")` on entry: a missing column raises `SchemaError` naming it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, fields

import polars as pl

from clarify.options import declared, spec


def column(dtype: pl.DataType):
    """A row record's field, declared as every field is (options.declared): the Polars type of its column
    (`table_schema`)."""
    return declared(dtype=dtype)


@dataclass(frozen=True)
class Passage:
    """One passage as prompts number and quote it: a searched index row (PASSAGES) or a question's own
    source (QuoteSum, eval/datasets/quotesum.py)."""

    passage_id: str = column(pl.String)
    title: str = column(pl.String)
    text: str = column(pl.String)


def table_schema(record: type) -> dict[str, pl.DataType]:
    """The table schema of a row record: its fields, in order, with their columns' types. A table whose rows
    a program builds one at a time (the tree's rows) declares its record once and takes its schema from it."""
    return {f.name: spec(f).dtype for f in fields(record)}


def frame(rows: Iterable, record: type) -> pl.DataFrame:
    """Row records as their table (an empty table with the schema when there are none)."""
    rows = list(rows)
    schema = table_schema(record)
    return pl.DataFrame({name: [getattr(r, name) for r in rows] for name in schema}, schema=schema)


def rows(df: pl.DataFrame, record: type) -> list:
    """The table's rows as row records, in order: the inverse of `frame`. A column the record does not declare
    is left out; one the table lacks reads None (a table written by an older clarify, checked with `check`'s
    `columns` by its reader, may miss one)."""
    names = [f.name for f in fields(record)]
    absent = {n: None for n in names if n not in df.columns}
    return [record(**row, **absent) for row in df.select([n for n in names if n not in absent]).iter_rows(named=True)]


@dataclass(frozen=True)
class QuestionRow:
    """A question of a run (questions.parquet) or of a dataset's questions table."""

    qid: str = column(pl.String)
    question: str = column(pl.String)
    dataset: str = column(pl.String)


QUESTIONS = table_schema(QuestionRow)

PASSAGES = table_schema(Passage)

# A hit's own columns, declared once: a searcher's, a run's and the search cache's hits hold them.
# retriever: bm25 | dense | fused | rerank
HIT = {"passage_id": pl.String, "score": pl.Float64, "rank": pl.Int32, "retriever": pl.String}

# A searcher's output (clarify.index)
HITS = {"qid": pl.String, **HIT}

@dataclass(frozen=True)
class RunHit:
    """A run's hit (parts/NNNN/hits.parquet and the final hits.parquet): HITS plus the node and the tree's
    round (`wave`) that asked, and the query sent."""

    qid: str = column(pl.String)
    node_id: str = column(pl.String)
    wave: int = column(pl.Int32)
    query: str = column(pl.String)
    passage_id: str = column(HIT["passage_id"])
    score: float = column(HIT["score"])
    rank: int = column(HIT["rank"])
    retriever: str = column(HIT["retriever"])


RUN_HITS = table_schema(RunHit)

# The shared search cache (batch/run/search_cache.py): one searcher's hits per (query, k), in a folder named
# by the searcher's identity (kind, candidates, reranker, the index's manifest checksum).
SEARCH_CACHE = {"query": pl.String, "k": pl.Int32, **HIT}

@dataclass(frozen=True)
class NodeRow:
    """A ToC tree node as the nodes table holds it. status: root | valid | pruned | duplicate | pending
    (batch/toc/tree.py Status)."""

    qid: str = column(pl.String)
    node_id: str = column(pl.String)
    parent_id: str | None = column(pl.String)
    depth: int = column(pl.Int32)
    question: str = column(pl.String)
    answers: tuple[str, ...] = column(pl.List(pl.String))
    status: str = column(pl.String)
    wave: int = column(pl.Int32)
    evidence_passage_id: str | None = column(pl.String)
    verdict_text: str | None = column(pl.String)


NODES = table_schema(NodeRow)

# The node statuses that count as a disambiguation the tree kept (summary, report, plots, Answer-F1): a
# valid node stays valid once expanded; the root is the ambiguous question itself.
KEPT_STATUSES = ("valid",)

@dataclass(frozen=True)
class LlmCall:
    """One prompt sent to (or answered from the cache of) an engine. step: clarify | verify | answer
    (batch/toc/program.py Step); parse_error: why the completion did not parse, None when it did."""

    call_id: str = column(pl.String)
    step: str = column(pl.String)
    qid: str = column(pl.String)
    node_id: str = column(pl.String)
    wave: int = column(pl.Int32)
    model: str = column(pl.String)
    prompt: str = column(pl.String)
    completion: str = column(pl.String)
    finish_reason: str | None = column(pl.String)
    prompt_tokens: int = column(pl.Int64)
    output_tokens: int = column(pl.Int64)
    cached: bool = column(pl.Boolean)
    parse_error: str | None = column(pl.String)


LLM_CALLS = table_schema(LlmCall)


@dataclass(frozen=True)
class TreeAnswer:
    """A tree's answer as its program writes it, before the quote check (parts/NNNN/answers.parquet)."""

    qid: str = column(pl.String)
    answer: str = column(pl.String)
    passage_ids: tuple[str, ...] = column(pl.List(pl.String))
    style: str = column(pl.String)


TREE_ANSWERS = table_schema(TreeAnswer)

@dataclass(frozen=True)
class AnswerRow:
    """A run's final answer (answers.parquet). answer: the final answer, with `[k span]` markers when quoted
    (after quote repair); answer_raw: as the model wrote it; passage_ids[k-1] is the passage numbered k in
    the prompt."""

    qid: str = column(pl.String)
    answer: str = column(pl.String)
    answer_raw: str = column(pl.String)
    answer_plain: str = column(pl.String)
    passage_ids: tuple[str, ...] = column(pl.List(pl.String))
    style: str = column(pl.String)


ANSWERS = table_schema(AnswerRow)


@dataclass(frozen=True)
class SpanRow:
    """A quoted span of a run's answer (spans.parquet, batch/toc/quotes.py)."""

    qid: str = column(pl.String)
    span_no: int = column(pl.Int32)
    source_k: int | None = column(pl.Int32)
    passage_id: str | None = column(pl.String)
    text: str = column(pl.String)
    start: int | None = column(pl.Int32)
    end: int | None = column(pl.Int32)
    verbatim: bool = column(pl.Boolean)
    status: str = column(pl.String)  # verbatim | repaired | unmarked | bad_source | empty (see batch/toc/quotes.py)
    field: str = column(pl.String)  # "text" or "title": which field of the passage start/end point into
    similarity: float = column(pl.Float64)  # 1.0 when verbatim; the repair match ratio otherwise
    # [start, end) of the span's `[k span]` marker in answers.answer_raw (the model's text; span_no is the
    # marker's 1-based order there): answer_raw[marker_start:marker_end] is the marker as written
    marker_start: int | None = column(pl.Int32)
    marker_end: int | None = column(pl.Int32)


SPANS = table_schema(SpanRow)


@dataclass(frozen=True)
class ScoreRow:
    """A question's score on one metric (scores.parquet, eval/summary.py)."""

    qid: str = column(pl.String)
    metric: str = column(pl.String)
    value: float | None = column(pl.Float64)


SCORES = table_schema(ScoreRow)

# A summary of metrics (eval/summary.py): one row per metric, its mean over `n` questions, a note.
METRICS = {"metric": pl.String, "value": pl.Float64, "n": pl.Int64, "note": pl.String}

# `clarify generate` (local_llm/cli.py): one row per prompt of the user's file.
GENERATIONS = {"id": pl.String, **{c: LLM_CALLS[c] for c in ("prompt", "completion", "finish_reason",
                                                             "prompt_tokens", "output_tokens", "cached")}}

# What a searcher is asked (index/search.py): one row per query; qids may repeat.
QUERIES = {"qid": pl.String, "query": pl.String}

# Predictions read by `clarify eval` (eval/io.py): an official prediction file or a run's answers.
PREDICTIONS = {"qid": pl.String, "answer": pl.String}

# Gold tables, one row per gold item (eval/datasets). ASQA: one row per qa_pair (asqa/scoring.py reads
# `qa_pairs[].short_answers` and `annotations[].long_answer`); the question's long answers repeat on each.
ASQA_GOLD = {
    "qid": pl.String,
    "pair_no": pl.Int32,
    "dq": pl.String,
    "short_answers": pl.List(pl.String),
    "long_answers": pl.List(pl.String),
}

# QuoteSum: one row per human reference summary (the dataset's rows; SEMQA metrics hold one out).
QUOTESUM_GOLD = {
    "qid": pl.String,
    "ref_id": pl.String,
    "summary": pl.String,
    "covered_short_answers": pl.String,
    "sources_present": pl.List(pl.Int32),
}

SCHEMAS: dict[str, dict[str, pl.DataType]] = {
    "questions": QUESTIONS,
    "passages": PASSAGES,
    "queries": QUERIES,
    "hits": HITS,
    "run_hits": RUN_HITS,
    "search_cache": SEARCH_CACHE,
    "nodes": NODES,
    "llm_calls": LLM_CALLS,
    "tree_answers": TREE_ANSWERS,
    "answers": ANSWERS,
    "spans": SPANS,
    "scores": SCORES,
    "metrics": METRICS,
    "generations": GENERATIONS,
    "predictions": PREDICTIONS,
    "asqa_gold": ASQA_GOLD,
    "quotesum_gold": QUOTESUM_GOLD,
}


class SchemaError(ValueError):
    """A table handed to a stage lacks columns (or has them with the wrong type): `columns` names them."""

    def __init__(self, message: str, columns: list[str]):
        super().__init__(message)
        self.columns = columns


def check(df: pl.DataFrame, name: str, *, columns: list[str] | None = None) -> pl.DataFrame:
    """Raise SchemaError naming every missing/mistyped column of table `name`; return `df` unchanged.

    `columns` restricts the check to the columns the stage actually reads.
    """
    schema = SCHEMAS[name]
    wanted = columns if columns is not None else list(schema)
    missing = [c for c in wanted if c not in df.columns]
    if missing:
        raise SchemaError(f"table '{name}' is missing column(s) {missing}; it has {df.columns}", missing)
    wrong = [c for c in wanted if c in schema and df.schema[c] != schema[c] and df.schema[c] != pl.Null]
    if wrong:
        raise SchemaError(f"table '{name}' has mistyped column(s): "
                          + "; ".join(f"{c}: {df.schema[c]} (expected {schema[c]})" for c in wrong), wrong)
    return df


def empty(name: str) -> pl.DataFrame:
    """An empty table with the declared schema."""
    return pl.DataFrame(schema=SCHEMAS[name])


def conform(df: pl.DataFrame, name: str) -> pl.DataFrame:
    """Cast and order `df` to the declared schema (extra columns are kept, at the end)."""
    schema = SCHEMAS[name]
    check(df, name, columns=list(schema))
    cols = [pl.col(c).cast(t) for c, t in schema.items()]
    extra = [c for c in df.columns if c not in schema]
    return df.select(cols + extra)
