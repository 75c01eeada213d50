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
A run makes it concrete before anything is frozen (`resolve_pool`, batch/resources.py `prepare`): config.json
records the pool used, inputs.json its file's sha256 and size. SEMQA demos come from QuoteSum dev, never
the question being answered.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from clarify.batch.toc.format import Disambiguation
from clarify.batch.toc.prompts import Demo, QuotedDemo
from clarify.batch.toc.tree import normalize
from clarify.errors import InputError
from clarify.eval import datasets
from clarify.eval.datasets.asqa import AUTO, SHIPPED_POOL, TRAIN_POOL, parse_pool_spec
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




def _demo(sample_id: str, ex: dict) -> Demo | None:
    """One ASQA instance as a clarification demo: each qa_pair with a short answer → DQ with its first short
    answer (toc/utils.py:12-23 make_str_disambig, ambigQA=True), the first annotation's long answer; None
    when it has no such pair or no annotation."""
    pairs = tuple(Disambiguation(p["question"], (p["short_answers"][0],))
                  for p in ex["qa_pairs"] if p.get("short_answers"))
    if pairs and ex.get("annotations"):
        return Demo(sample_id, ex["ambiguous_question"], pairs, ex["annotations"][0]["long_answer"])
    return None


@lru_cache(maxsize=4)
def _file_demos(path: str, stamp: tuple[int, int]) -> dict[str, tuple[Demo | None, ...]]:
    """Every split of an official-layout ASQA file as demos in file order (None where an instance makes no
    demo), read once per file version (`stamp`: mtime and size)."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise InputError(f"cannot read ASQA demos: {exc}", path=path) from exc
    if not isinstance(data, dict):
        raise InputError("not an ASQA file in the official layout ({split: {sample_id: {...}}})", path=path)
    out = {}
    for split, rows in data.items():
        if not isinstance(rows, dict):
            if split in ("train", "dev"):  # a split a pool spec names: never skipped in silence
                raise InputError(f"split '{split}' is a JSON {type(rows).__name__}, not an object of sample_id -> "
                                 f"instance (the official ASQA layout)", path=path, field=split)
            continue
        demos = []
        for sample_id, ex in rows.items():
            try:
                demos.append(_demo(str(sample_id), ex))
            except (KeyError, TypeError, IndexError, AttributeError) as exc:
                raise InputError(f"an ASQA instance unfit for a demo ({exc!r})", path=path,
                                 field=f"{split}.{sample_id}") from exc
        out[split] = tuple(demos)
    return out


def asqa_splits(path: str | Path) -> dict[str, tuple[Demo | None, ...]]:
    """split → its instances as demos (`_file_demos`), for the file as it is now."""
    try:
        st = os.stat(path)
    except OSError as exc:
        raise InputError(f"cannot read ASQA demos: {exc.strerror or exc}", path=str(path)) from exc
    return _file_demos(str(Path(path).resolve()), (st.st_mtime_ns, st.st_size))


def load_asqa_demos(path: Path | None = None, start: int = 0, stop: int | None = None, *,
                    split: str = "dev") -> list[Demo]:
    """`split`[start:stop] of an official-layout ASQA file (default: the shipped dev set) as clarification
    demos (`_demo`); a slice counts every instance of the file, demo or not."""
    path = path or datasets.get("asqa").default_path()
    splits = asqa_splits(path)
    if split not in splits:
        raise InputError(f"no split '{split}' in the ASQA file (top level: {list(splits)[:5]})", path=str(path),
                         field="demo_pool")
    return [d for d in splits[split][start:stop] if d is not None]


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
        return load_asqa_demos(self.path, self.start, self.stop, split=self.split)

    def identity(self) -> dict[str, Any]:
        """What inputs.json pins (batch/rundir.py input_changes compares the sha256)."""
        from clarify.files import sha256

        return {"spec": self.spec, "path": str(self.path), "sha256": sha256(self.path), "demos": len(self.demos())}

    def line(self, n_demos: int) -> str:
        """The run's one line about its pool."""
        why = f" ({self.fallback})" if self.fallback else ""
        return f"demo pool {self.spec}{why}: {n_demos:,} demos from the {self.split} split of {self.path}"


def resolve_pool(cfg: Any) -> Pool:
    """The concrete pool of a run config (a RunConfig): `auto` → `asqa:train` when the run's own ASQA file
    (eval/datasets `demo_file`: ASQA's questions file) has a train split, as the official code always has
    (run_toc.py:23, :191), else `asqa:dev[500:]`; a spec without `@FILE` reads that own file, or the shipped
    ASQA dev set when the dataset is not ASQA."""
    own = datasets.get(cfg.dataset).demo_file(cfg.questions_file())
    spec, fallback = cfg.demo_pool.strip(), ""  # config.json records the spec as parsed, not as typed
    if spec == AUTO:
        if own is not None and "train" in asqa_splits(own):
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
