"""A searcher wrapper that computes each distinct (query, k) once and shares it between runs.

`clarify compare` runs every model over the same questions and index; the root queries (and any
disambiguated question two models both produce) are searched once. Results live in a folder of
Parquet files (one per batch of new queries, written atomically), so separate processes share them.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import polars as pl

from clarify.schemas import SEARCH_CACHE as _SCHEMA


class CachingSearcher:
    def __init__(self, inner, folder: str | Path):
        self.inner = inner
        self.name = getattr(inner, "name", "searcher")
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.searched = 0  # queries that reached the inner searcher
        self.reused = 0

    def _known(self) -> pl.DataFrame:
        files = sorted(self.folder.glob("*.parquet"))
        if not files:
            return pl.DataFrame(schema=_SCHEMA)
        return pl.concat([pl.read_parquet(f) for f in files]).unique(["query", "k", "rank"], keep="first")

    def search(self, queries: pl.DataFrame, k: int) -> pl.DataFrame:
        known = self._known().filter(pl.col("k") == k)
        have = set(known["query"].to_list())
        missing = queries.filter(~pl.col("query").is_in(list(have))).unique("query", keep="first",
                                                                              maintain_order=True)
        self.reused += queries.height - missing.height
        if missing.height:
            self.searched += missing.height
            fresh = self.inner.search(missing.select("qid", "query"), k)
            fresh = fresh.join(missing.select("qid", "query"), on="qid").select(
                "query", pl.lit(k, pl.Int32).alias("k"), "passage_id", "score", "rank", "retriever")
            tmp = self.folder / f".{uuid.uuid4().hex}.tmp"
            fresh.write_parquet(tmp)
            os.replace(tmp, self.folder / f"{uuid.uuid4().hex}.parquet")
            known = pl.concat([known, fresh.cast(_SCHEMA)])
        return (queries.select("qid", "query")
                .join(known, on="query", how="inner")
                .select("qid", "passage_id", "score", "rank", "retriever")
                .sort(["qid", "rank"]))
