"""Few-shot demo pools, chosen per prompt by embedding kNN (ToC §3.1: dsp.knn over the train split,
5 demos, nearest last — run_toc.py `demos.reverse()`).

The clarification demos come from an ASQA file in the official layout (`{"train": …, "dev": …}`), as the
run config's `demo_pool` names them (docs/running-toc.md#the-whole-asqa-dev-set):
- `asqa:train`: every train question, as the official code has it (run_toc.py:23-41 `get_dataset` reads
  train and dev, :35 the train DQ/DA strings, :52 `dsp.knn(train)`, :191 `cur_demos = train.copy()`);
- `asqa:dev[a:b]`: dev questions a..b-1 — the shipped data has no train split (data/asqa/SOURCE.md), so its
  default is `asqa:dev[500:]` and a run answers the dev questions outside it (eval/datasets/asqa.py);
- either with `@FILE`: that file's split instead of the run's own ASQA file (its questions file when the
  dataset is ASQA, else the shipped dev set);
- `auto` (the default): `asqa:train` when the run's own ASQA file has a train split, else `asqa:dev[500:]`.
A run makes it concrete before anything is frozen (`resolve_pool`, batch/run/resources.py `prepare`): config.json
records the pool used, inputs.json its file's sha256 and size. SEMQA demos come from QuoteSum dev, never
the question being answered.

The files are read by their datasets (eval/datasets `Dataset.demos`, with the reader their questions and gold
are loaded with); this module only resolves the pool and picks from it.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from clarify.batch.toc.tree import normalize
from clarify.errors import InputError
from clarify.eval import datasets
from clarify.eval.datasets.asqa import AUTO, SHIPPED_POOL, TRAIN_POOL, parse_pool_spec
from clarify.fewshot import Demo
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


@dataclass(frozen=True)
class Pool:
    """A run's concrete clarification demo pool (`resolve_pool`)."""

    spec: str  # concrete, never "auto": what config.json records
    split: str
    start: int
    stop: int | None
    path: Path  # the ASQA file it reads
    from_questions: bool  # a slice of the run's own questions (same file, dev): a run must not answer it
    fallback: str = ""  # why "auto" did not take a train split

    def demos(self) -> list[Demo]:
        """The pool's demos, read by the ASQA dataset (eval/datasets/asqa.py `ASQA.demos`)."""
        return datasets.get("asqa").demos(self.split, path=self.path, start=self.start, stop=self.stop)

    def identity(self) -> dict[str, Any]:
        """What inputs.json pins (batch/run/rundir.py input_changes compares the sha256)."""
        from clarify.files import sha256

        return {"spec": self.spec, "path": str(self.path), "sha256": sha256(self.path), "demos": len(self.demos())}

    def line(self, n_demos: int) -> str:
        """The run's one line about its pool."""
        why = f" ({self.fallback})" if self.fallback else ""
        return f"demo pool {self.spec}{why}: {n_demos:,} demos from the {self.split} split of {self.path}"


def resolve_pool(spec: str, *, dataset: str, questions_file: Path) -> Pool:
    """The concrete pool of a run's `demo_pool` spec, given its dataset and questions file: `auto` →
    `asqa:train` when the run's own ASQA file (eval/datasets `demo_file`: ASQA's questions file) has a train
    split, as the official code always has (run_toc.py:23, :191), else `asqa:dev[500:]`; a spec without
    `@FILE` reads that own file, or the shipped ASQA dev set when the dataset is not ASQA."""
    own = datasets.get(dataset).demo_file(questions_file)
    spec, fallback = spec.strip(), ""  # config.json records the spec as parsed, not as typed
    if spec == AUTO:
        if own is not None and "train" in datasets.get("asqa").splits(own):
            spec = TRAIN_POOL
        else:
            spec = SHIPPED_POOL
            if own is not None and Path(own).resolve() != Path(datasets.get("asqa").default_path()).resolve():
                fallback = f"{Path(own).name} has no train split"
    parsed = parse_pool_spec(spec)
    path = Path(parsed.file) if parsed.file else own or datasets.get("asqa").default_path()
    if parsed.file and not Path(path).is_file():
        why = "a directory, not a file" if Path(path).is_dir() else "not found"
        raise InputError(f"the demo pool {spec!r} names an ASQA file: {why}", path=str(path), field="demo_pool")
    same = own is not None and parsed.split == "dev" and Path(path).resolve() == Path(own).resolve()
    return Pool(spec, parsed.split, parsed.start, parsed.stop, Path(path), same, fallback)
