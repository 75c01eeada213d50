"""Second-stage scorers for `RerankSearcher` (adapter module: sentence-transformers inside functions).

- `CrossEncoderScorer`: a sentence-transformers `CrossEncoder` from a local directory scores each
  (query, "title\\ntext") pair jointly.
- `DenseCosineScorer`: the fallback when no cross-encoder is configured: cosine between the encoded
  query and each candidate's stored passage vector (memmap / FAISS reconstruct; re-encoded if neither).
  Note: over an exact (flat) dense index whose top-`candidates` are part of the fused set, this ranks
  the top-k exactly like dense retrieval; it differs with IVF/HNSW or a separate rerank encoder.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import polars as pl
from tqdm.auto import tqdm

from clarify.errors import InputError
from clarify.index.dense import DenseIndex, Encoder, passage_texts
from clarify.index.search import cosine

Lookup = Callable[[list[str]], pl.DataFrame]  # passage ids -> passages [passage_id, title, text], same order


class DenseCosineScorer:
    def __init__(self, encoder: Encoder, dense: DenseIndex | None, lookup: Lookup):
        self.encoder, self.dense, self.lookup = encoder, dense, lookup
        self.name = f"dense-cosine:{encoder.name}"

    def _vectors(self, ids: list[str]) -> np.ndarray:
        if self.dense is not None and self.dense.dim == self.encoder.dim:
            vec = self.dense.vectors(ids)
            if vec is not None:
                return vec
        return self.encoder.encode(passage_texts(self.lookup(ids)))

    def score(self, queries: list[str], passage_ids: list[list[str]]) -> list[np.ndarray]:
        if not queries:
            return []
        qv = self.encoder.encode_queries(queries)
        flat = [p for ids in passage_ids for p in ids]
        pv = self._vectors(flat) if flat else np.zeros((0, self.encoder.dim), dtype=np.float32)
        out, start = [], 0
        for i, ids in enumerate(passage_ids):
            out.append(cosine(qv[i], pv[start : start + len(ids)]))
            start += len(ids)
        return out


class CrossEncoderScorer:
    def __init__(self, model_dir: str | Path, lookup: Lookup, *, batch_size: int = 64, device: str | None = None,
                 max_length: int = 512):
        path = Path(model_dir).expanduser()
        if not path.is_dir():
            raise InputError("cross-encoder must be a local model directory", path=str(path), field="cross_encoder")
        from sentence_transformers import CrossEncoder

        try:
            self.model = CrossEncoder(str(path), device=device or "cpu", max_length=max_length, local_files_only=True,
                                      trust_remote_code=False)  # never the folder's own code
        except Exception as exc:
            raise InputError(f"cannot load the cross-encoder: {exc}", path=str(path), field="cross_encoder") from exc
        self.lookup, self.batch_size = lookup, batch_size
        self.name = f"cross-encoder:{path.name}"

    def score(self, queries: list[str], passage_ids: list[list[str]]) -> list[np.ndarray]:
        flat = [p for ids in passage_ids for p in ids]
        if not flat:
            return [np.zeros(0) for _ in queries]
        uniq = list(dict.fromkeys(flat))
        texts = dict(zip(uniq, passage_texts(self.lookup(uniq))))
        pairs = [(q, texts[p]) for q, ids in zip(queries, passage_ids) for p in ids]
        chunk = 8192
        scores = np.concatenate([
            np.asarray(self.model.predict(pairs[s : s + chunk], batch_size=self.batch_size), dtype=np.float64).reshape(-1)
            for s in tqdm(range(0, len(pairs), chunk), desc="cross-encoder", unit="chunk", disable=len(pairs) <= chunk or None)
        ])
        out, start = [], 0
        for ids in passage_ids:
            out.append(scores[start : start + len(ids)])
            start += len(ids)
        return out
