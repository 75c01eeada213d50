"""Run configuration: frozen dataclasses, loaded from one TOML file, overridable by CLI flags,
written once into the run directory (`config.json`).

Defaults are the Tree of Clarifications paper's (Kim et al., EMNLP 2023, §3 and appendix A) and its
official code (gankim/tree-of-clarifications `run_toc.py` argparse defaults). Where clarify can do
something differently from the official code, a named switch chooses, and its default is the official
behaviour (README "Differences from the official code"); `batch/previous.toml` restores the
choices clarify made before issue 12.
"""

from __future__ import annotations

import dataclasses
import json
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from clarify.errors import InputError

# What a ToC question costs the engine (prompt + output tokens) on the embedded model and defaults:
# ~21,500 (bench/results/toc12.json, the demo). The demo's size and a run's ETA are estimated from it.
TOKENS_PER_QUESTION = 21_500

DATASETS = ("asqa", "quotesum", "jsonl")
ANSWER_STYLES = ("free", "quoted")


@dataclass(frozen=True)
class RetrievalConfig:
    candidates: int = 100  # per retriever before fusion (run_toc.py --top_k_docs 100)
    top_k: int = 5  # passages in each prompt (run_toc.py --top_k_reranked 5)
    pool: int = 100  # passages retrieved per search (run_toc.py --top_k_docs 100, toc/rac.py:5)
    searcher: str = "rerank"  # bm25 | dense | hybrid | rerank
    # "pool": the question is searched once and every node reranks that pool (minus exhausted passages)
    # by its own question (run_toc.py:198-199, :219 get_example → rerank); "search": every node searches
    # the index again with its own question (clarify before issue 12).
    node_passages: str = "pool"

    def __post_init__(self) -> None:
        _positive(self, "candidates", "top_k", "pool")
        if self.pool < self.top_k:
            raise InputError(f"retrieval.pool ({self.pool}) must be >= retrieval.top_k ({self.top_k})")
        if self.searcher not in ("bm25", "dense", "hybrid", "rerank"):
            raise InputError(f"unknown searcher {self.searcher!r}", field="retrieval.searcher")
        _choice(self, "node_passages", ("pool", "search"))


@dataclass(frozen=True)
class TocConfig:
    max_depth: int = 3  # --max_depth
    max_nodes: int = 10  # --max_nodes: stop once this many valid nodes exist
    max_expansions: int = 15  # `n_expansions <= 15` in run_toc.py
    max_restarts: int = 3  # --max_trials
    undo_pruning_after: int = 10  # run_toc.py: pruning is switched off after 10 fruitless expansions
    verify: bool = True  # self-verification pruning (--verify)
    n_demos: int = 5  # --n_shot
    temperature: float = 0.7  # --temperature (clarification)
    clarify_max_tokens: int = 256
    verify_max_tokens: int = 3
    answer_max_tokens: int = 320
    answer_nodes: int = 10  # DQ/DA pairs in the answer prompt (_get_tree(max_nodes))
    answer_passages: int = 5  # passages in the answer prompt (--top_k_reranked)
    # --- where clarify may differ from the official code (defaults = official) ---
    # "official": toc/pruning.py:7-15 check_unique, only while pruning, against earlier valid nodes;
    # "strict": clarify's rule (question repeats, or answers all covered), also without pruning.
    duplicates: str = "official"
    # "official": run_toc.py:94-123 over the whole demo pool and the passages as the retriever has them
    # (title and text), matching whole DA strings; "shown": only the demos shown, text only, split answers.
    removal: str = "official"
    # "pool": rerank the question's own retrieved pool by the question (run_toc.py:259);
    # "nodes": one answer-containing passage per valid node, then the question's top passages.
    answer_passages_from: str = "pool"
    # False: the clarification seed is a function of the prompt, so a byte-identical re-expansion (after a
    # restart) gets the cached completion, as the official run does through dsp's request cache;
    # True: the seed includes the node and expansion count, every expansion samples afresh.
    restart_resample: bool = False
    # "filter": the intended get_evidence (toc/pruning.py:17-25): shown passages containing the answer,
    # top-1 by the reranker; "official": as published (the filter is a no-op), reranker top-1 of all
    # shown passages; "filter-embed": the filter, scored by the dense encoder's cosine (before issue 12).
    evidence: str = "filter"

    def __post_init__(self) -> None:
        _positive(self, "max_depth", "max_nodes", "max_expansions", "max_restarts", "n_demos",
                  "clarify_max_tokens", "verify_max_tokens", "answer_max_tokens", "answer_nodes",
                  "answer_passages")
        if self.temperature < 0:
            raise InputError("must be >= 0", field="toc.temperature")
        _choice(self, "duplicates", ("official", "strict"))
        _choice(self, "removal", ("official", "shown"))
        _choice(self, "answer_passages_from", ("pool", "nodes"))
        _choice(self, "evidence", ("filter", "official", "filter-embed"))


@dataclass(frozen=True)
class ModelConfig:
    model: str = "smollm2-135m-instruct"
    max_model_len: int = 6144
    gpu_memory_utilization: float = 0.85
    tensor_parallel_size: int = 1
    stop: tuple[str, ...] = ()  # extra stop strings (base models without a chat template)
    # "auto": bfloat16 where the CPU computes it natively, float32 otherwise, the model's own on CUDA
    # (local_llm/hardware.py). The dtype really run is recorded in summary.json and every cache key.
    dtype: str = "auto"

    def __post_init__(self) -> None:
        from clarify.local_llm.hardware import DTYPES

        object.__setattr__(self, "stop", tuple(self.stop))
        if self.dtype not in DTYPES:
            raise InputError(f"unknown dtype {self.dtype!r}; choose one of {DTYPES}", field="model.dtype")


@dataclass(frozen=True)
class RunConfig:
    dataset: str = "asqa"
    questions: str = ""  # path of a JSONL {qid, question} file when dataset == "jsonl"; else the shipped file
    offset: int = 0
    limit: int = 20
    seed: int = 0
    answer_style: str = "quoted"
    index: str = ""  # index directory; empty = the embedded default index
    demo_pool: str = "asqa:dev[500:]"  # no ASQA train split here: demos come from dev questions 500..947
    retrieval: RetrievalConfig = field(default_factory=RetrievalConfig)
    toc: TocConfig = field(default_factory=TocConfig)
    model: ModelConfig = field(default_factory=ModelConfig)

    def __post_init__(self) -> None:
        if self.dataset not in DATASETS:
            raise InputError(f"unknown dataset {self.dataset!r}; choose one of {DATASETS}", field="dataset")
        if self.answer_style not in ANSWER_STYLES:
            raise InputError(f"unknown answer style {self.answer_style!r}; choose {ANSWER_STYLES}",
                             field="answer_style")
        if self.dataset == "jsonl" and not self.questions:
            raise InputError("dataset 'jsonl' needs a questions file", field="questions")
        if self.limit < 0 or self.offset < 0:
            raise InputError("offset and limit must be >= 0", field="limit")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)


_SECTIONS = {"retrieval": RetrievalConfig, "toc": TocConfig, "model": ModelConfig}


def _positive(obj: Any, *names: str) -> None:
    for name in names:
        if getattr(obj, name) < 1:
            raise InputError(f"must be >= 1, got {getattr(obj, name)}", field=f"{type(obj).__name__}.{name}")


def _choice(obj: Any, name: str, allowed: tuple[str, ...]) -> None:
    if getattr(obj, name) not in allowed:
        section = {"RetrievalConfig": "retrieval", "TocConfig": "toc"}.get(type(obj).__name__, "")
        raise InputError(f"unknown value {getattr(obj, name)!r}; choose one of {allowed}", field=f"{section}.{name}")


def from_dict(data: dict[str, Any], *, source: str = "config") -> RunConfig:
    """Build a RunConfig from nested dicts; unknown keys are errors that name the key."""
    data = dict(data)
    kwargs: dict[str, Any] = {}
    for section, cls in _SECTIONS.items():
        sub = data.pop(section, {}) or {}
        if not isinstance(sub, dict):
            raise InputError("must be a table", path=source, field=section)
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(sub) - names)
        if unknown:
            raise InputError(f"unknown key(s) {unknown}; known: {sorted(names)}", path=source, field=section)
        kwargs[section] = cls(**sub)
    names = {f.name for f in dataclasses.fields(RunConfig)}
    unknown = sorted(set(data) - names)
    if unknown:
        raise InputError(f"unknown key(s) {unknown}; known: {sorted(names)}", path=source)
    kwargs.update(data)
    try:
        return RunConfig(**kwargs)
    except TypeError as exc:
        raise InputError(str(exc), path=source) from exc


def load(path: str | Path | None, overrides: dict[str, Any] | None = None) -> RunConfig:
    """Load a TOML config (or the defaults when `path` is None) and apply dotted-key overrides,
    e.g. {"toc.max_depth": 2, "limit": 5}."""
    data: dict[str, Any] = {}
    source = "defaults"
    if path is not None:
        source = str(path)
        try:
            data = tomllib.loads(Path(path).read_text(encoding="utf-8"))
        except FileNotFoundError as exc:
            raise InputError("config file not found", path=source) from exc
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
            raise InputError(f"not valid TOML: {exc}", path=source) from exc
    for key, value in (overrides or {}).items():
        if value is None:
            continue
        target = data
        *parents, leaf = key.split(".")
        for p in parents:
            target = target.setdefault(p, {})
        target[leaf] = value
    return from_dict(data, source=source)
