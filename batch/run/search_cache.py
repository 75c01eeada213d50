"""A searcher wrapper that computes each distinct (query, k) once and shares it between runs.

`clarify compare` runs every model over the same questions and index; the root queries (and any
disambiguated question two models both produce) are searched once. Results live in a folder of
Parquet files (one per batch of new queries, written atomically: files.py), so separate processes
share them. The key is the searcher's identity + query + k: each identity (the searcher kind, its
candidates, its reranker, the index's manifest checksum: `batch/run/resources.py` searcher_identity) has
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
from clarify.schemas import HIT, HITS, SEARCH_CACHE


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
        self._seen: set[str] = set()  # the folder's files read so far (each file is written once)
        self._rows: dict[tuple[str, int], pl.DataFrame] = {}  # (query, k) -> its hits, first file wins
        self._read_new()

    def _read_new(self) -> None:
        """Add the files other processes wrote since the last look (in name order: the first file holding a
        (query, k) wins, as before). Called only when a lookup misses, so a warm cache costs one dict
        lookup per query, not a folder listing and a concatenation of every row."""
        for f in sorted(self.folder.glob("*.parquet")):
            if f.name not in self._seen:
                self._seen.add(f.name)
                self._add(pl.read_parquet(f).cast(SEARCH_CACHE))

    def _add(self, frame: pl.DataFrame) -> None:
        for (query, k), rows in frame.partition_by(["query", "k"], as_dict=True, maintain_order=True).items():
            self._rows.setdefault((query, int(k)), rows.unique("rank", keep="first", maintain_order=True))

    def search(self, queries: pl.DataFrame, k: int) -> pl.DataFrame:
        wanted = list(dict.fromkeys(queries["query"].to_list()))
        if any((q, k) not in self._rows for q in wanted):
            self._read_new()
        missing = queries.filter(~pl.col("query").is_in([q for q in wanted if (q, k) in self._rows])).unique(
            "query", keep="first", maintain_order=True)
        self.reused += queries.height - missing.height
        if missing.height:
            self.searched += missing.height
            fresh = self.inner.search(missing.select("qid", "query"), k)
            fresh = fresh.join(missing.select("qid", "query"), on="qid").select(
                "query", pl.lit(k, SEARCH_CACHE["k"]).alias("k"), *HIT)
            name = f"{uuid.uuid4().hex}.parquet"
            write_parquet(fresh, self.folder / name)
            self._seen.add(name)
            self._add(fresh.cast(SEARCH_CACHE))
            for q in missing["query"].to_list():  # a query with no hits at all is still known
                self._rows.setdefault((q, k), pl.DataFrame(schema=SEARCH_CACHE))
        known = pl.concat([self._rows[(q, k)] for q in wanted]) if wanted else pl.DataFrame(schema=SEARCH_CACHE)
        return (queries.select("qid", "query")
                .join(known, on="query", how="inner")
                .select(*HITS)
                .sort(["qid", "rank"]))
