"""The `Searcher` protocol, the kinds of searcher an index gives, and the pure parts of searching: hit
tables, reciprocal-rank fusion, hybrid retrieval and second-stage reranking.

Every searcher maps `queries` [qid, query] to `hits` [qid, passage_id, score, rank, retriever]
(schemas.HITS), rank starting at 1, rows grouped by query in input order, best first. Duplicate qids
are allowed (each query row gets its own ranked list). `retriever` is bm25 | dense | fused | rerank;
`Searcher.name` says exactly what ran (e.g. "rerank:dense-cosine:all-MiniLM-L6-v2").
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import StrEnum
from typing import Protocol, runtime_checkable

import numpy as np
import polars as pl

from clarify.errors import InputError
from clarify.schemas import HITS, SchemaError, check


class SearcherKind(StrEnum):
    """The searchers an index gives (`LocalIndex.searcher`, index/local.py); a run's `retrieval.searcher`."""

    BM25 = "bm25"
    DENSE = "dense"
    HYBRID = "hybrid"
    RERANK = "rerank"


SEARCHER_KINDS = tuple(k.value for k in SearcherKind)  # `clarify index search --retriever`
# `clarify index search`'s defaults (index/cli.py): hits per query, and the searcher, fusion of both retrievers
# without a reranker's cost (a run's own default, `retrieval.searcher`, is batch/config/schema.py's)
SEARCH_K = 10
SEARCH_SEARCHER = SearcherKind.HYBRID

# Passages each retriever hands to fusion and reranking (run_toc.py --top_k_docs 100): the default of
# `Index.searcher`, `clarify index search|coverage --candidates` and a run's `[retrieval] candidates`.
CANDIDATES = 100

RRF_K = 60  # Cormack, Clarke & Buettcher (SIGIR 2009), "Reciprocal Rank Fusion outperforms Condorcet ...": k = 60


@runtime_checkable
class Searcher(Protocol):
    name: str

    def search(self, queries: pl.DataFrame, k: int) -> pl.DataFrame:
        """queries [qid, query] -> hits [qid, passage_id, score, rank, retriever]."""
        ...


def check_queries(queries: pl.DataFrame) -> pl.DataFrame:
    """queries [qid, query] -> the same two columns (null query -> ""); InputError naming a missing or
    mistyped column (schemas.check)."""
    if not isinstance(queries, pl.DataFrame):
        raise InputError(f"queries must be a polars DataFrame [qid, query], got {type(queries).__name__}")
    try:
        check(queries, "queries")
    except SchemaError as exc:
        raise InputError(str(exc), field=exc.columns[0]) from None
    return queries.select(pl.col("qid").cast(pl.String), pl.col("query").cast(pl.String).fill_null(""))


def check_k(k) -> int:
    """k must be a positive integer (InputError otherwise)."""
    if isinstance(k, bool) or not isinstance(k, int | np.integer) or k < 1:
        raise InputError(f"k must be a positive integer, got {k!r}", field="k")
    return int(k)


def cosine(query: np.ndarray, passages: Sequence[np.ndarray] | np.ndarray) -> np.ndarray:
    """The cosine of one query vector with each passage vector, in order: their dot products, since every
    encoder here returns L2-normalised vectors (index/encode.py). The one dense scorer of a reranking:
    `DenseCosineScorer` (index/rerank.py), the scheduler's fallback without a reranker and the
    "filter-embed" evidence (batch/toc/program.py)."""
    if len(passages) == 0:
        return np.zeros(0, dtype=np.float32)
    return np.asarray(np.stack(passages) if not isinstance(passages, np.ndarray) else passages) @ query


def hits_frame(qids: list[str], pids: list[list[str]], scores: list[list[float]], retriever: str) -> pl.DataFrame:
    """Per-query ranked lists (already best first) -> `hits` table, rank from 1."""
    lens = [len(p) for p in pids]
    return pl.DataFrame(
        {
            "qid": [q for q, n in zip(qids, lens) for _ in range(n)],
            "passage_id": [p for ps in pids for p in ps],
            "score": [float(s) for ss in scores for s in ss],
            "rank": [r for n in lens for r in range(1, n + 1)],
            "retriever": [retriever] * sum(lens),
        },
        schema=HITS,
    )


def rrf_fuse(runs: list[pl.DataFrame], k: int, *, rrf_k: int = RRF_K, key: str = "qid") -> pl.DataFrame:
    """Reciprocal-rank fusion of several hit lists (Cormack et al. 2009): score(d) = Σ_runs 1 / (rrf_k + rank_run(d)).

    runs: hits tables [key, passage_id, rank, ...]; a passage absent from a run adds nothing for it.
    Returns hits [key, passage_id, score, rank, retriever="fused"], top `k` per key, ties broken by the
    best single-run rank, then passage_id (deterministic). Keys keep their first-seen order.
    """
    if not runs:
        raise ValueError("rrf_fuse needs at least one run")
    both = pl.concat([r.select(key, "passage_id", "rank") for r in runs], how="vertical")
    order = both.select(key).unique(maintain_order=True).with_row_index("_order")
    fused = (
        both.group_by(key, "passage_id")
        .agg((1.0 / (rrf_k + pl.col("rank").cast(pl.Float64))).sum().alias("score"), pl.col("rank").min().alias("_best"))
        .join(order, on=key)
        .sort(["_order", "score", "_best", "passage_id"], descending=[False, True, False, False])
        .with_columns(pl.int_range(1, pl.len() + 1).over(key).cast(pl.Int32).alias("rank"))
        .filter(pl.col("rank") <= k)
        .select(key, "passage_id", "score", "rank", pl.lit("fused").alias("retriever"))
    )
    return fused


def _positional(queries: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Replace qids by row positions ("0", "1", ...) so duplicate qids keep separate lists; return the map."""
    pos = queries.with_row_index("_pos").with_columns(pl.col("_pos").cast(pl.String))
    return pos.select(pl.col("_pos").alias("qid"), "query"), pos.select("_pos", "qid")


def _restore(hits: pl.DataFrame, posmap: pl.DataFrame) -> pl.DataFrame:
    return (
        hits.rename({"qid": "_pos"})
        .join(posmap, on="_pos", how="left", maintain_order="left")
        .select(list(HITS))
    )


class HybridSearcher:
    """Union of BM25 top-`candidates` and dense top-`candidates`, fused by RRF (k=60); top-k out.

    search(queries [qid, query], k) -> hits with retriever "fused".
    """

    retriever = "fused"

    def __init__(self, bm25: Searcher, dense: Searcher, *, candidates: int = CANDIDATES, rrf_k: int = RRF_K):
        self.bm25, self.dense, self.candidates, self.rrf_k = bm25, dense, int(candidates), rrf_k
        self.name = f"hybrid:rrf{rrf_k}({bm25.name}+{dense.name})@{self.candidates}"

    def search(self, queries: pl.DataFrame, k: int) -> pl.DataFrame:
        queries, k = check_queries(queries), check_k(k)
        posq, posmap = _positional(queries)
        return _restore(self.fused(posq, depth=max(int(k), self.candidates), k=int(k)), posmap)

    def fused(self, queries: pl.DataFrame, *, depth: int, k: int | None = None) -> pl.DataFrame:
        """RRF of both retrievers' top-`depth` lists; all of the union when k is None. qids must be unique."""
        runs = [self.bm25.search(queries, depth), self.dense.search(queries, depth)]
        return rrf_fuse(runs, 2 * depth if k is None else k, rrf_k=self.rrf_k)


class PairScorer(Protocol):
    name: str

    def score(self, queries: list[str], passage_ids: list[list[str]]) -> list[np.ndarray]:
        """For each query, one relevance score per candidate passage (higher is better)."""
        ...


class RerankSearcher:
    """Second stage: the whole fused candidate set (union of both retrievers' top-`candidates`) is
    rescored per query by `scorer` (a cross-encoder, or dense cosine), top-k kept.

    search(queries [qid, query], k) -> hits with retriever "rerank", score = the scorer's score.
    """

    retriever = "rerank"

    def __init__(self, hybrid: HybridSearcher | Searcher, scorer: PairScorer, *, candidates: int | None = None):
        # `hybrid`: the fused first stage; or any one searcher (BM25 alone, on an index without a dense
        # part), whose top-`candidates` are rescored
        self.hybrid, self.scorer = hybrid, scorer
        self.candidates = candidates or getattr(hybrid, "candidates", CANDIDATES)
        self.name = f"rerank:{scorer.name}" + ("" if hasattr(hybrid, "fused") else f"({hybrid.name})")

    def search(self, queries: pl.DataFrame, k: int) -> pl.DataFrame:
        queries, k = check_queries(queries), check_k(k)
        posq, posmap = _positional(queries)
        # the whole union of both retrievers' top-`candidates` (ToC: ~200 candidates), in RRF order
        if hasattr(self.hybrid, "fused"):
            cands = self.hybrid.fused(posq, depth=max(self.hybrid.candidates, int(k)))
        else:  # one first-stage searcher: its own ranking is the candidates' order
            cands = self.hybrid.search(posq, max(self.candidates, int(k)))
        lists = cands.group_by("qid", maintain_order=True).agg("passage_id")
        by_pos = dict(zip(lists["qid"].to_list(), lists["passage_id"].to_list()))
        pos_ids = posq["qid"].to_list()
        cand_ids = [by_pos.get(p, []) for p in pos_ids]
        scores = self.scorer.score(posq["query"].to_list(), cand_ids)
        out_p, out_s = [], []
        for ids, sc in zip(cand_ids, scores):
            sc = np.asarray(sc, dtype=np.float64)
            # Scores rounded to 5 decimals before sorting, ties in fused order: the cross-encoder's floats
            # move in the last bits with the batch a query is scored in, and a ranking must not.
            r = np.round(sc, 5)
            order = sorted(range(len(ids)), key=lambda i: (-r[i], i))[: int(k)]
            out_p.append([ids[i] for i in order])
            out_s.append([float(sc[i]) for i in order])
        return _restore(hits_frame(pos_ids, out_p, out_s, self.retriever), posmap)
