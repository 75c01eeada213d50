"""Small stand-ins for the scheduler's unit tests: a token-overlap searcher over real shipped passages
and a hashing embedder. The real index and the real vLLM engine are used in tests/test_toc_real.py."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import numpy as np
import polars as pl

from clarify.index.dense import QueryMemo

DATA = Path(__file__).resolve().parent.parent / "data"


def _tokens(text: str) -> set[str]:
    return set(re.findall(r"[a-z0-9]+", text.lower()))


class HashEncoder(QueryMemo):
    """Bag-of-words hashed into 256 dims, L2-normalised: deterministic and batch-independent."""

    name = "hash-256"

    def encode(self, texts: list[str]) -> np.ndarray:
        out = np.zeros((len(texts), 256), dtype=np.float32)
        for i, t in enumerate(texts):
            for tok in _tokens(t):
                out[i, int(hashlib.md5(tok.encode()).hexdigest(), 16) % 256] += 1.0
        norms = np.linalg.norm(out, axis=1, keepdims=True)
        return out / np.maximum(norms, 1e-9)


class OverlapSearcher:
    name = "overlap"

    def __init__(self, passages: pl.DataFrame):
        self.passages = passages
        self.toks = [_tokens(f"{t} {x}") for t, x in zip(passages["title"], passages["text"])]
        self.calls = 0

    def _score(self, query: str, toks: list[set[str]]) -> np.ndarray:
        q = _tokens(query)
        return np.array([len(q & t) / (1 + len(t)) ** 0.5 for t in toks])

    def score(self, queries: list[str], passage_ids: list[list[str]]) -> list[np.ndarray]:
        """The PairScorer protocol (index.search): the same overlap score for given candidates."""
        at = {p: i for i, p in enumerate(self.passages["passage_id"])}
        return [self._score(q, [self.toks[at[p]] for p in ids]) for q, ids in zip(queries, passage_ids)]

    def search(self, queries: pl.DataFrame, k: int) -> pl.DataFrame:
        self.calls += 1
        rows = []
        for qid, query in zip(queries["qid"], queries["query"]):
            scores = self._score(query, self.toks)
            order = np.argsort(-scores, kind="stable")[:k]
            rows += [{"qid": qid, "passage_id": self.passages["passage_id"][int(j)], "score": float(scores[j]),
                      "rank": r, "retriever": "overlap"} for r, j in enumerate(order, 1)]
        return pl.DataFrame(rows, schema={"qid": pl.String, "passage_id": pl.String, "score": pl.Float64,
                                          "rank": pl.Int32, "retriever": pl.String})


class FakeIndex:
    """The slice of clarify.index.LocalIndex the pipeline uses."""

    def __init__(self, n: int = 400):
        rows = [json.loads(line) for line in (DATA / "wiki" / "passages.jsonl").read_text().splitlines()[:n]]
        self.passages = pl.DataFrame({"passage_id": [r["id"] for r in rows], "title": [r["title"] for r in rows],
                                      "text": [r["text"] for r in rows]})
        self.encoder = HashEncoder()
        self._searcher = OverlapSearcher(self.passages)

    def searcher(self, kind: str = "rerank", candidates: int = 100, cross_encoder: str | None = None) -> OverlapSearcher:
        return self._searcher

    def scorer(self, cross_encoder: str | None = None) -> OverlapSearcher:
        return self._searcher

    def passage_lookup(self, ids: list[str]) -> pl.DataFrame:
        order = pl.DataFrame({"passage_id": ids})
        return order.join(self.passages, on="passage_id", how="left", maintain_order="left")
