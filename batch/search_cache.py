"""A searcher wrapper that computes each distinct (query, k) once and shares it between runs.

`clarify compare` runs every model over the same questions and index; the root queries (and any
disambiguated question two models both produce) are searched once. Results live in a folder of
Parquet files (one per batch of new queries, written atomically: files.py), so separate processes
share them. The key is the searcher's identity + query + k: each identity (the searcher kind, its
candidates, its reranker, the index's manifest checksum: `batch/pipeline.py` searcher_identity) has
its own subfolder, `<folder>/<sha256 of the identity, 16 hex>/` with `identity.json`, so a cache
reused with another index or searcher never hands back another searcher's passages.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from pathlib import Path

import polars as pl

from clarify.files import write_json, write_parquet
from clarify.schemas import SEARCH_CACHE


class CachingSearcher:
    def __init__(self, inner, folder: str | Path, identity: dict):
        self.inner = inner
        self.name = getattr(inner, "name", "searcher")
        key = hashlib.sha256(json.dumps(identity, sort_keys=True, default=str).encode("utf-8")).hexdigest()[:16]
        self.folder = Path(folder) / key
        self.folder.mkdir(parents=True, exist_ok=True)
        if not (self.folder / "identity.json").exists():
            write_json(identity, self.folder / "identity.json")
        self.searched = 0  # queries that reached the inner searcher
        self.reused = 0
        self._files: dict[str, pl.DataFrame] = {}  # the folder's files read so far (each file is written once)

    def _known(self) -> pl.DataFrame:
        """Every result in the folder: the files read before, plus those other processes added since."""
        for f in self.folder.glob("*.parquet"):
            if f.name not in self._files:
                self._files[f.name] = pl.read_parquet(f).cast(SEARCH_CACHE)
        if not self._files:
            return pl.DataFrame(schema=SEARCH_CACHE)
        frames = [self._files[name] for name in sorted(self._files)]
        return pl.concat(frames).unique(["query", "k", "rank"], keep="first")

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
            name = f"{uuid.uuid4().hex}.parquet"
            write_parquet(fresh, self.folder / name)
            self._files[name] = fresh = fresh.cast(SEARCH_CACHE)
            known = pl.concat([known, fresh])
        return (queries.select("qid", "query")
                .join(known, on="query", how="inner")
                .select("qid", "passage_id", "score", "rank", "retriever")
                .sort(["qid", "rank"]))
