"""Few-shot demo pools, chosen per prompt by embedding kNN (ToC §3.1: dsp.knn over the train split,
5 demos, nearest last — run_toc.py `demos.reverse()`).

No ASQA train split exists here (data/asqa/SOURCE.md), so the clarification demos come from ASQA dev
questions 500..947 and evaluation uses questions 0..499; the split is recorded in the run config
(`demo_pool`). SEMQA demos come from QuoteSum dev, never the question being answered.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from clarify.batch.parse import Disambiguation
from clarify.batch.prompts import Demo, QuotedDemo
from clarify.batch.tree import normalize
from clarify.errors import InputError
from clarify.eval import datasets
from clarify.eval.datasets.quotesum import numbered_sources
from clarify.files import home, write_npy

Embed = Callable[[list[str]], np.ndarray]

def _cache_dir() -> Path:
    return home() / "demo_vectors"


class KnnPool:
    """Items with a question each; `select` returns the n nearest per query, nearest LAST."""

    def __init__(self, items: Sequence, embed: Embed, *, name: str, encoder_id: str = "encoder"):
        if not items:
            raise InputError(f"demo pool {name!r} is empty")
        self.items = list(items)
        self._norm_q = [normalize(i.question) for i in self.items]
        key = hashlib.sha1(json.dumps([encoder_id] + [i.question for i in self.items]).encode()).hexdigest()[:16]
        path = _cache_dir() / f"{name}-{key}.npy"
        if path.exists():
            self.vectors = np.load(path)
        else:
            self.vectors = np.asarray(embed([i.question for i in self.items]), dtype=np.float32)
            write_npy(self.vectors, path)

    def select(self, query_vectors: np.ndarray, questions: Sequence[str], n: int,
               exclude: Sequence[Sequence[str]] | None = None) -> list[list]:
        """Per query: the n most similar items (cosine; vectors are normalised), excluding item ids in
        `exclude[i]` and items whose question equals the query's, ordered so the nearest comes last."""
        sims = np.asarray(query_vectors, dtype=np.float32) @ self.vectors.T
        out = []
        for i, row in enumerate(sims):
            banned = set(exclude[i]) if exclude else set()
            nq = normalize(questions[i])
            # Rounded scores + a stable sort make the choice independent of float noise between batches.
            order = np.argsort(-np.round(row, 5), kind="stable")
            picked = []
            for j in order:
                item = self.items[j]
                if item.demo_id in banned or self._norm_q[j] == nq:
                    continue
                picked.append(item)
                if len(picked) == n:
                    break
            out.append(picked[::-1])
        return out


def load_asqa_demos(path: Path | None = None, start: int = 500, stop: int | None = None) -> list[Demo]:
    """ASQA dev[start:stop] as clarification demos: each qa_pair → DQ with its first short answer
    (toc/utils.py make_str_disambig, ambigQA=True), the first annotation's long answer."""
    try:
        path = path or datasets.get("asqa").default_path()
        dev = json.loads(Path(path).read_text(encoding="utf-8"))["dev"]
    except (OSError, ValueError, KeyError) as exc:
        raise InputError(f"cannot read ASQA demos: {exc}", path=str(path)) from exc
    demos = []
    for sample_id, ex in list(dev.items())[start:stop]:
        pairs = tuple(Disambiguation(p["question"], (p["short_answers"][0],))
                      for p in ex["qa_pairs"] if p.get("short_answers"))
        if pairs and ex.get("annotations"):
            demos.append(Demo(sample_id, ex["ambiguous_question"], pairs, ex["annotations"][0]["long_answer"]))
    return demos


def parse_pool_spec(spec: str) -> tuple[str, int, int | None]:
    """'asqa:dev[500:]' → ('asqa', 500, None)."""
    m = re.fullmatch(r"asqa:dev\[(\d*):(\d*)\]", spec.strip())
    if not m:
        raise InputError(f"unknown demo pool {spec!r}; expected e.g. 'asqa:dev[500:]'", field="demo_pool")
    return "asqa", int(m.group(1) or 0), int(m.group(2)) if m.group(2) else None


def load_quotesum_demos(path: Path | None = None) -> list[QuotedDemo]:
    """QuoteSum dev rows (one per qid: the first) as SEMQA demos. Only rows whose non-empty sources are
    numbered 1..K without gaps are used, so the `[k span]` markers keep pointing at the right source;
    their ids are those of a QuoteSum run's given sources (eval/datasets/quotesum.py `numbered_sources`)."""
    demos, seen = [], set()
    path = path or datasets.get("quotesum").default_path()
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            row = json.loads(line)
            if row["qid"] in seen:
                continue
            srcs = [(row.get(f"title{k}", ""), row.get(f"source{k}", "")) for k in range(1, 9)]
            n = sum(1 for _, s in srcs if s)
            if n < 2 or any(not s for _, s in srcs[:n]):
                continue
            seen.add(row["qid"])
            sources = tuple(numbered_sources(row["qid"], [t for t, _ in srcs[:n]], [s for _, s in srcs[:n]]))
            demos.append(QuotedDemo(row["qid"], row["question"], sources, row["summary"]))
    return demos
