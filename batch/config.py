"""Run configuration: frozen dataclasses, loaded from one TOML file, overridable by CLI flags,
written once into the run directory (`config.json`).

Defaults are the Tree of Clarifications paper's (Kim et al., EMNLP 2023, §3 and appendix A) and its
official code (gankim/tree-of-clarifications `run_toc.py` argparse defaults). Where clarify can do
something differently from the official code, a named switch chooses, and its default is the official
behaviour (docs/fidelity.md); `batch/previous.toml` restores the choices clarify made before these
switches existed.
"""

from __future__ import annotations

import dataclasses
import json
import math
import tomllib
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

from clarify.batch.toc.format import Parsing
from clarify.batch.toc.match import MatchRule
from clarify.errors import InputError, redacted
from clarify.eval import datasets
from clarify.eval.datasets.asqa import pool_spec_problem
from clarify.index.search import CANDIDATES
from clarify.index.store import SearcherKind
from clarify.local_llm import backends
from clarify.local_llm.settings import CHAT_TEMPLATES, DTYPES, QUANTIZATIONS
from clarify.options import setting, toml_value

# What a ToC question costs the engine (prompt + output tokens actually computed: identical re-expansion
# prompts are answered once under the official default) on the embedded model and defaults: ~4,400
# (the first 50 ASQA dev questions: 4,275; the demo's 11: 4,382; an AVX2 CPU). The previous behaviour
# (batch/previous.toml, re-sampling) costs ~17,000. The demo's size and a run's ETA are estimated from it.
TOKENS_PER_QUESTION = 4_400
# Constrained trees exist (11 valid nodes per question instead of ~0.1), so a question costs more: on ASQA dev
# 0-49 with SmolLM2 (bench/results/constrained.json) 18.6 LLM calls per question vs 8.4 free, 1,010 s at 680
# engine tok/s: ~13,700 tokens of engine time per question (AMD EPYC, bfloat16); a fresh-clone `make demo` of
# 20 constrained questions took 400 s of ToC at 715 tok/s: ~14,300 per question.
CONSTRAINED_TOKENS_PER_QUESTION = 15_000
# LLM calls the engine computes per question (cache hits aside), free and constrained: ASQA dev 0-49 with
# SmolLM2 made 8.4 and 18.6 calls per question (bench/results/constrained.json), of which the engine computed
# ~86 % in the demo's runs (16.0 and 16.1 of 18.6 for 3 and 20 questions: bench/results/estimate.json).
CALLS_PER_QUESTION, CONSTRAINED_CALLS_PER_QUESTION = 7, 16
PART_TREES = 64  # finished trees per checkpoint part (batch/rundir.py), unless a minute passes first



class Scheduler(StrEnum):
    """How trees are driven (batch/scheduler.py DRIVERS: one driver each). It never changes results: tables
    are identical under each, so it is a setting a run may change when resumed (RunDir.freeze ignores
    RESULT_FREE, dotted: one field of a table)."""

    CONTINUOUS = "continuous"
    WAVES = "waves"
    SEQUENTIAL = "sequential"


SCHEDULERS = tuple(s.value for s in Scheduler)  # `--scheduler` and the config's choices


# The choice settings: a field whose type is one of these StrEnums takes exactly its values (RULES derives the
# choices from the type). A member equals its string, so config.json and TOML hold the plain value; each
# value's meaning is the comment on the field that takes it.
class AnswerStyle(StrEnum):
    FREE = "free"
    QUOTED = "quoted"


class NodePassages(StrEnum):
    POOL = "pool"
    SEARCH = "search"


class Duplicates(StrEnum):
    OFFICIAL = "official"
    STRICT = "strict"


class Removal(StrEnum):
    OFFICIAL = "official"
    SHOWN = "shown"


class AnswerPassagesFrom(StrEnum):
    POOL = "pool"
    NODES = "nodes"


class Evidence(StrEnum):
    FILTER = "filter"
    OFFICIAL = "official"
    FILTER_EMBED = "filter-embed"


class EmptyTreeAnswer(StrEnum):
    OPEN = "open"
    CLOSED = "closed"


ANSWER_STYLES = tuple(s.value for s in AnswerStyle)  # `--answer-style`

# Where the trees run (one process, or Ray workers: batch/cluster.py) never changes results either, nor how
# the openai backend talks to its server (a completion it accepts is the same whatever its deadlines,
# retries or size cap): a run stopped by a deadline resumes with a longer one.
RESULT_FREE = ("scheduler", "cluster", "model.max_concurrency", "model.request_timeout_s", "model.max_retries",
               "model.check_timeout_s", "model.reply_bytes_per_token")


def result_free(key: str) -> bool:
    """Whether the setting `key` ("scheduler", "model.max_retries") is in RESULT_FREE, itself or its table."""
    return key in RESULT_FREE or key.split(".")[0] in RESULT_FREE


@dataclass(frozen=True)
class RetrievalConfig:
    candidates: int = CANDIDATES  # per retriever before fusion (run_toc.py --top_k_docs 100)
    top_k: int = 5  # passages in each prompt (run_toc.py --top_k_reranked 5)
    pool: int = 100  # passages retrieved per search (run_toc.py --top_k_docs 100, toc/rac.py:5)
    searcher: SearcherKind = SearcherKind.RERANK  # bm25 | dense | hybrid | rerank
    # "pool": the question is searched once and every node reranks that pool (minus exhausted passages)
    # by its own question (run_toc.py:198-199, :219 get_example → rerank); "search": every node searches
    # the index again with its own question (clarify before this switch existed).
    node_passages: NodePassages = NodePassages.POOL
    # A local sentence-transformers CrossEncoder directory reranking the fused candidates and every node's
    # pool (run_toc.py:164 dsp's cross-encoder); empty: the dense encoder's cosine
    # (docs/retrieval.md#searchers-and-the-reranker). It changes every ranking, so it is part of the frozen config.
    cross_encoder: str = setting("", help="local sentence-transformers CrossEncoder directory reranking the retrieved "
                                          "passages; empty: the dense encoder's cosine", flag="--cross-encoder",
                                 metavar="DIR")
    # Attached to `index` (a clarify index or a prebuilt Pyserini Lucene index) from elsewhere (docs/retrieval.md):
    # a Pyserini FAISS directory (`index` + `docid`) and the query encoder that goes with it (a
    # sentence-transformers folder, or a Hugging Face DPRQuestionEncoder folder as for Pyserini's DPR
    # indexes). Empty: the index's own dense part and encoder (none for a prebuilt Lucene index: BM25 only).
    faiss_index: str = setting("", help="a Pyserini FAISS directory (files index + docid) to search with --index, "
                                        "e.g. a prebuilt DPR index; empty: the index's own dense part",
                               flag="--faiss-index", metavar="DIR")
    encoder: str = setting("", help="the query encoder of --faiss-index: a sentence-transformers folder or a Hugging "
                                    "Face DPRQuestionEncoder folder; empty: the index's own", flag="--encoder",
                           metavar="DIR")
    nprobe: int = setting(0, help="IVF lists searched per query; 0: the index's", flag="--nprobe", metavar="N")
    ef_search: int = setting(0, help="HNSW efSearch; 0: the index's", flag="--ef-search", metavar="N")

    def __post_init__(self) -> None:
        _settle(self, "retrieval")


@dataclass(frozen=True)
class TocConfig:
    max_depth: int = 3  # --max_depth
    max_nodes: int = 10  # --max_nodes: stop once this many valid nodes exist
    max_expansions: int = 15  # `n_expansions <= 15` in run_toc.py
    max_restarts: int = 3  # --max_trials
    undo_pruning_after: int = 10  # run_toc.py: pruning is switched off after 10 fruitless expansions
    verify: bool = setting(True, help="self-verification pruning (run_toc.py --verify); the flag switches it off",
                           flag="--no-verify", switch=False)
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
    duplicates: Duplicates = Duplicates.OFFICIAL
    # "official": run_toc.py:94-123 over the whole demo pool and the passages as the retriever has them
    # (title and text), matching whole DA strings; "shown": only the demos shown, text only, split answers.
    removal: Removal = Removal.OFFICIAL
    # "pool": rerank the question's own retrieved pool by the question (run_toc.py:259);
    # "nodes": one answer-containing passage per valid node, then the question's top passages.
    answer_passages_from: AnswerPassagesFrom = AnswerPassagesFrom.POOL
    # False: the clarification seed is a function of the prompt, so a byte-identical re-expansion (after a
    # restart) gets the cached completion, as the official run does through dsp's request cache;
    # True: the seed includes the node and expansion count, every expansion samples afresh.
    restart_resample: bool = False
    # "filter": the intended get_evidence (toc/pruning.py:17-25): shown passages containing the answer,
    # top-1 by the reranker; "official": as published, the DA string's single characters are the answers
    # (a no-op for most answers, not for e.g. "16"); "filter-embed": the filter, scored by the dense
    # encoder's cosine (clarify's earlier behaviour).
    evidence: Evidence = Evidence.FILTER
    # "dsp": the tree's answer matching (a passage holds an answer, F1 of two answers) as the official code's
    # dsp has it (batch/toc/match.py); "squad": the metrics' ASQA/SQuAD normalisation, whitespace tokens, an
    # empty answer matches nothing and two empty answers have F1 1 (clarify's earlier behaviour).
    matching: MatchRule = MatchRule.DSP
    # "open": a free-style answer prompt of a tree without valid nodes ends open at `Disambiguations:`, as
    # the official template renders an empty DQ/DA field (toc/tree.py:32-40, dsp/templates/template_v2.py:73-83);
    # "closed": it asks for the answer directly (clarify's earlier behaviour).
    empty_tree_answer: EmptyTreeAnswer = EmptyTreeAnswer.OPEN
    # "clarify": every DQ/DA pair the official parser finds (toc/utils.py:25-46), with its text, plus pairs
    # from the lines it drops (batch/toc/format.py); "official": exactly the official parser's pairs.
    parsing: Parsing = Parsing.CLARIFY
    # True: each clarification is decoded under a grammar of the official DQ/DA format, so it parses
    # (batch/toc/format.py format_grammar; docs/running-toc.md). False: free decoding, as the official code.
    constrain_format: bool = setting(False, help="decode clarifications under a grammar of the DQ/DA format; off: "
                                                 "the official free decoding", flag="--constrain-format", switch=True)

    def __post_init__(self) -> None:
        _settle(self, "toc")


@dataclass(frozen=True)
class AnswerConfig:
    """The final answer step (its style is the top-level `answer_style`)."""

    # True: in the quoted style, the text of each `[k ...]` marker is decoded under a grammar that only
    # allows runs of source k's words, so every quote is verbatim by construction
    # (batch/toc/constraints.py quotes_grammar; docs/running-toc.md). False: free decoding, the checker repairs or unmarks.
    constrain_quotes: bool = setting(False, help="decode quoted answers so every [k span] is a run of source k's "
                                                 "words", flag="--constrain-quotes", switch=True)

    def __post_init__(self) -> None:
        _raise(_problems_of(self, "answer"), "config")


@dataclass(frozen=True)
class ModelConfig(backends.Options):
    """The `[model]` table: the engine's options (local_llm/settings.py EngineOptions) and the openai client's
    (local_llm/openai_engine.py ClientOptions), declared there with their defaults, and the run's own two.
    One flat table, so config.json keeps the keys it always had."""

    stop: tuple[str, ...] = setting((), help="extra stop strings (base models without a chat template)")
    backend: str = setting("vllm", help="which engine (local_llm/backends.py): \"vllm\" starts vLLM in this "
                                        "process; \"openai\" talks to a running OpenAI-compatible server at "
                                        "base_url (`model` is then the name it serves; empty: its only model)")

    def __post_init__(self) -> None:
        if isinstance(self.stop, list):
            object.__setattr__(self, "stop", tuple(self.stop))
        _raise(_problems_of(self, "model"), "config")


@dataclass(frozen=True)
class ClusterConfig:
    """Ray scale-out (batch/cluster.py, docs/scale.md#running-on-a-cluster); never changes results."""

    workers: int = setting(0, help="run the trees on N Ray workers, one engine each (a GPU, a tensor-parallel "
                                   "group, or CPU cores); 0: in this process", flag="--workers", metavar="N")
    ray_address: str = setting("", help="join a running Ray cluster ('auto', or HOST:PORT of `ray start --head`) "
                                        "instead of starting a local one, where --workers defaults to its GPUs / "
                                        "tensor_parallel_size; empty: a local Ray cluster for this run",
                               flag="--ray-address", metavar="ADDR")
    chunk_questions: int = setting(64, help="questions handed to a worker at a time; each finished chunk is one part",
                                   flag="--chunk-questions", metavar="N")
    cores_per_worker: int = 0  # CPU engines: cores bound per worker; 0 = this machine's cores split evenly

    def __post_init__(self) -> None:
        _raise(_problems_of(self, "cluster"), "config")


@dataclass(frozen=True)
class RunConfig:
    dataset: str = setting("asqa", help="question set", flag="--dataset")
    questions: str = setting("", help="questions file: JSONL {qid, question} for --dataset jsonl; for asqa an "
                                      "official-layout ASQA.json, whose train split is then the demo pool; empty: "
                                      "the dataset's shipped dev set (asqa, quotesum)", flag="--questions")
    offset: int = setting(0, help="skip the first N questions", flag="--offset")
    limit: int = setting(20, help="answer N questions; 0 = all: for asqa every dev question, or with the shipped "
                                  "dev-only file every one outside the demo pool dev 500-947", flag="--limit")
    seed: int = setting(0, help="sampling seed of the run", flag="--seed")
    answer_style: AnswerStyle = setting(AnswerStyle.QUOTED, help="free: the official long answer; quoted: SEMQA [k span] answers",
                                flag="--answer-style")
    index: str = setting("", help="index directory; empty: the embedded Wikipedia index", flag="--index")
    # The clarification demos (batch/toc/demos.py): "auto" = the train split of the run's ASQA file when it has
    # one, as the official code (run_toc.py:191 `cur_demos = train.copy()`), else dev questions 500..947
    # (the shipped file has no train split); "asqa:train", "asqa:dev[a:b]", either with "@FILE". A run
    # records the pool it used (never "auto") in its config.json.
    demo_pool: str = setting("auto", help="few-shot clarification demos: asqa:train, asqa:dev[500:], either with "
                                          "@FILE; auto: the ASQA file's train split if it has one, else "
                                          "asqa:dev[500:]", flag="--demo-pool", metavar="SPEC")
    scheduler: Scheduler = setting(Scheduler.CONTINUOUS, help="how trees are driven; recorded, never changes results",
                                   flag="--scheduler")
    retrieval: RetrievalConfig = field(default_factory=RetrievalConfig)
    toc: TocConfig = field(default_factory=TocConfig)
    answer: AnswerConfig = field(default_factory=AnswerConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)

    def __post_init__(self) -> None:
        _settle(self, "")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def recorded(self) -> dict[str, Any]:
        """The settings as a run directory records them (config.json): any credentials in `model.base_url`
        replaced by *** (errors.redacted), so a password never reaches a file; a resumed run compares
        its own settings in this form."""
        d = self.to_dict()
        d["model"]["base_url"] = redacted(d["model"]["base_url"])
        return d

    def to_json(self) -> str:
        return json.dumps(self.recorded(), indent=2, sort_keys=True)

    def to_toml(self) -> str:
        """The whole config as TOML that `load` reads back to an equal config (`clarify run --print-config`),
        but for credentials in `model.base_url`, printed as *** (`recorded`)."""
        data = self.recorded()
        lines = [f"{k} = {toml_value(v)}" for k, v in data.items() if k not in _SECTIONS]
        for name in _SECTIONS:
            lines += ["", f"[{name}]", *(f"{k} = {toml_value(v)}" for k, v in data[name].items())]
        return "\n".join(lines) + "\n"

    def questions_file(self) -> Path:
        """The file the run's questions come from: `questions`, else the dataset's shipped file (a dataset
        without one needs `questions`: `_cross_problems` refuses the config otherwise)."""
        return Path(self.questions) if self.questions else datasets.get(self.dataset).default_path()


_SECTIONS = {"retrieval": RetrievalConfig, "toc": TocConfig, "answer": AnswerConfig, "model": ModelConfig,
             "cluster": ClusterConfig}


def flagged() -> list[tuple[str, dataclasses.Field]]:
    """(config key, field) of every setting declared with a `clarify run` flag (options.setting), in the
    order they are declared: the flags, their help and `commands._overrides` are generated from these."""
    return [(f"{section}.{f.name}" if section else f.name, f)
            for section, cls in [("", RunConfig), *_SECTIONS.items()]
            for f in dataclasses.fields(cls) if f.metadata.get("flag")]


def choices_of(key: str) -> tuple[str, ...] | None:
    """The allowed values of a choice setting (RULES), as its flag offers them."""
    rule = RULES.get(key)
    if rule is None or rule.choices is None:
        return None
    return tuple(rule.choices() if callable(rule.choices) else rule.choices)


# --- the declared schema ---------------------------------------------------------------------------
# Every field's type is its dataclass annotation (int, float, bool, str, tuple[str, ...]); ranges and
# allowed values are declared here, once. `validate` checks a whole raw config against both and raises
# ONE InputError naming every bad field, before anything heavy is loaded.


@dataclass(frozen=True)
class Rule:
    lo: float | None = None  # inclusive lower bound (exclusive when lo_open)
    hi: float | None = None  # inclusive upper bound
    lo_open: bool = False
    choices: tuple[str, ...] | Callable[[], tuple[str, ...]] | None = None  # a callable: asked at each check
    nonempty: bool = False

    def problem(self, value: Any) -> str | None:
        choices = self.choices() if callable(self.choices) else self.choices
        if choices is not None and value not in choices:
            return f"unknown value {value!r}; choose one of {choices}"
        if self.nonempty and not value:
            return "must not be empty"
        below = self.lo is not None and (value <= self.lo if self.lo_open else value < self.lo)
        if below or (self.hi is not None and value > self.hi):
            return f"must be {self.bounds()}, got {value!r}"
        return None

    def bounds(self) -> str:
        if self.hi is None:
            return f"{'>' if self.lo_open else '>='} {self.lo}"
        return f"in {'(' if self.lo_open else '['}{self.lo}, {self.hi}]"


POSITIVE = Rule(lo=1)
RULES: dict[str, Rule] = {
    "dataset": Rule(choices=datasets.names),  # the registry (eval/datasets/), datasets registered later too
    "offset": Rule(lo=0),
    "limit": Rule(lo=0),  # 0 = every question
    "retrieval.candidates": POSITIVE,
    "retrieval.top_k": POSITIVE,
    "retrieval.pool": POSITIVE,
    "retrieval.nprobe": Rule(lo=0),
    "retrieval.ef_search": Rule(lo=0),
    **{f"toc.{name}": POSITIVE for name in (
        "max_depth", "max_nodes", "max_expansions", "max_restarts", "n_demos", "clarify_max_tokens",
        "verify_max_tokens", "answer_max_tokens", "answer_nodes", "answer_passages")},
    "toc.undo_pruning_after": Rule(lo=0),
    # vLLM SamplingParams accepts any temperature >= 0; [0, 2] is the range of the OpenAI API that dsp
    # (and so the official ToC code) calls, and above 2 sampling is noise.
    "toc.temperature": Rule(lo=0, hi=2),
    "model.model": Rule(nonempty=True),
    "model.max_model_len": POSITIVE,
    # vLLM EngineArgs: the fraction of GPU memory the engine may use, in (0, 1]
    "model.gpu_memory_utilization": Rule(lo=0, hi=1, lo_open=True),
    "model.tensor_parallel_size": POSITIVE,
    "model.dtype": Rule(choices=DTYPES),
    "model.quantization": Rule(choices=QUANTIZATIONS),
    "model.chat_template": Rule(choices=tuple(CHAT_TEMPLATES)),
    "model.max_num_seqs": Rule(lo=0),
    "model.backend": Rule(choices=backends.names),
    "model.max_concurrency": POSITIVE,
    "model.request_timeout_s": Rule(lo=0, lo_open=True),
    "model.max_retries": Rule(lo=0),
    "model.check_timeout_s": Rule(lo=0, lo_open=True),
    "model.reply_bytes_per_token": POSITIVE,
    "cluster.workers": Rule(lo=0),
    "cluster.chunk_questions": POSITIVE,
    "cluster.cores_per_worker": Rule(lo=0),
}

_TYPE_WORDS = {bool: "a boolean (true or false)", int: "an integer", float: "a number", str: "a string",
               tuple: "a list of strings"}


def _type_problem(value: Any, hint: Any) -> str | None:
    """Why `value` is not of the declared type (TOML and JSON types: a bool is not a number, a
    string is not a boolean and not a list of strings), or None."""
    if hint is bool:
        ok = isinstance(value, bool)
    elif hint is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif hint is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    elif hint is str or _is_choice(hint):  # a choice's value is then checked by its Rule
        hint = str
        ok = isinstance(value, str)
    else:  # tuple[str, ...]
        hint = tuple
        ok = isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value)
    if ok:
        return None
    return f"expected {_TYPE_WORDS[hint]}, got {type(value).__name__} {value!r}"


def _hints(cls: type) -> dict[str, Any]:
    """The declared type of each plain field (RunConfig's sub-tables are checked on their own)."""
    return {k: v for k, v in typing.get_type_hints(cls).items() if cls is not RunConfig or k not in _SECTIONS}


def _is_choice(hint: Any) -> bool:
    """Whether a field's type is a choice: a StrEnum (AnswerStyle, Duplicates, ...), whose values are its choices."""
    return isinstance(hint, type) and issubclass(hint, StrEnum)


def _choice_rules() -> dict[str, Rule]:
    """The Rule of every choice field, derived from its type: the enum is the one declaration of its values."""
    return {f"{section}.{name}" if section else name: Rule(choices=tuple(m.value for m in hint))
            for section, cls in [("", RunConfig), *_SECTIONS.items()]
            for name, hint in _hints(cls).items() if _is_choice(hint)}


RULES.update(_choice_rules())


def _check_values(values: dict[str, Any], cls: type, section: str) -> list[tuple[str, str]]:
    """(field, problem) for every unknown key, wrong type and out-of-range value of one table."""
    prefix = f"{section}." if section else ""
    hints = _hints(cls)
    out: list[tuple[str, str]] = []
    unknown = sorted(set(values) - set(hints) - (set() if section else set(_SECTIONS)))
    if unknown:
        out.append((section, f"unknown key(s) {unknown}; known: {sorted(hints)}"))
    for name, hint in hints.items():
        if name not in values:
            continue
        value = values[name]
        problem = _type_problem(value, hint)
        if problem is None and (rule := RULES.get(prefix + name)) is not None:
            problem = rule.problem(value)
        if problem:
            out.append((prefix + name, problem))
    return out


def _cross_problems(top: dict[str, Any], sections: dict[str, dict[str, Any]]) -> list[tuple[str, str]]:
    out = []
    r = {f.name: f.default for f in dataclasses.fields(RetrievalConfig)} | sections.get("retrieval", {})
    if isinstance(r["pool"], int) and isinstance(r["top_k"], int) and r["pool"] < r["top_k"]:
        out.append(("retrieval.pool", f"must be >= retrieval.top_k ({r['top_k']}), got {r['pool']}"))
    if problem := pool_spec_problem(top.get("demo_pool", RunConfig.demo_pool)):
        out.append(("demo_pool", problem))
    name = top.get("dataset", RunConfig.dataset)
    if datasets.get(name).default_file is None and not top.get("questions"):
        out.append(("questions", f"dataset '{name}' needs a questions file"))
    return out


def validate(data: dict[str, Any], *, source: str = "config") -> None:
    """Check a raw config (nested dicts, as TOML gives them) against the declared schema; raise one
    InputError that names every bad field."""
    problems: list[tuple[str, str]] = []
    sections: dict[str, dict[str, Any]] = {}
    for name in _SECTIONS:
        sub = data.get(name, {})
        if sub is None:
            sub = {}
        if not isinstance(sub, dict):
            problems.append((name, f"must be a table, got {type(sub).__name__} {sub!r}"))
            continue
        sections[name] = sub
        problems += _check_values(sub, _SECTIONS[name], name)
    top = {k: v for k, v in data.items() if k not in _SECTIONS}
    problems += _check_values(top, RunConfig, "")
    if not problems:
        problems = _cross_problems(top, sections)
    _raise(problems, source)


def _problems_of(obj: Any, section: str) -> list[tuple[str, str]]:
    """The schema's verdict on an already-built config object (direct construction, dataclasses.replace)."""
    values = {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj) if f.name in _hints(type(obj))}
    problems = _check_values(values, type(obj), section)
    if not problems and section == "retrieval":
        problems = _cross_problems({}, {"retrieval": values})
    elif not problems and section == "":
        problems = _cross_problems(values, {})
    return problems


def _settle(obj: Any, section: str) -> None:
    """Check a config object against the schema (`_problems_of`), then hold each choice as its enum member,
    also when it was given as a plain string (direct construction, dataclasses.replace)."""
    _raise(_problems_of(obj, section), "config")
    for name, hint in _hints(type(obj)).items():
        if _is_choice(hint):
            object.__setattr__(obj, name, hint(getattr(obj, name)))


def _raise(problems: list[tuple[str, str]], source: str) -> None:
    if not problems:
        return
    if len(problems) == 1:
        name, msg = problems[0]
        raise InputError(msg, path=source, field=name or None)
    listed = "; ".join(f"{name or '(top level)'}: {msg}" for name, msg in problems)
    raise InputError(f"{len(problems)} bad config fields: {listed}", path=source)


def _as_declared(values: dict[str, Any], cls: type) -> dict[str, Any]:
    """Validated values in their declared Python types (an integer given for a float field is a float)."""
    hints = _hints(cls)
    return {k: float(v) if hints.get(k) is float else tuple(v) if isinstance(v, list)
            else hints[k](v) if _is_choice(hints.get(k)) else v for k, v in values.items()}


def from_dict(data: dict[str, Any], *, source: str = "config") -> RunConfig:
    """Build a RunConfig from nested dicts; every bad key or value is named in one InputError."""
    validate(data, source=source)
    kwargs: dict[str, Any] = {name: cls(**_as_declared(data.get(name) or {}, cls)) for name, cls in _SECTIONS.items()}
    kwargs.update(_as_declared({k: v for k, v in data.items() if k not in _SECTIONS}, RunConfig))
    return RunConfig(**kwargs)


def load(path: str | Path | None, overrides: dict[str, Any] | None = None) -> RunConfig:
    """Load a TOML config (or the defaults when `path` is None) and apply dotted-key overrides,
    e.g. {"toc.max_depth": 2, "limit": 5}."""
    data: dict[str, Any] = {}
    source = "defaults"
    if path is not None:
        source = str(path)
        if Path(path).is_dir():
            raise InputError("is a directory; --config takes a TOML file", path=source)
        try:
            text = Path(path).read_text(encoding="utf-8")
            # a run directory's frozen config.json repeats that run's settings (`clarify compare` passes one)
            data = json.loads(text) if Path(path).suffix == ".json" else tomllib.loads(text)
        except FileNotFoundError as exc:
            raise InputError("config file not found", path=source) from exc
        except OSError as exc:
            raise InputError(f"cannot read the config file: {exc.strerror or exc}", path=source) from exc
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
            raise InputError(f"not valid TOML: {exc}", path=source) from exc
        except json.JSONDecodeError as exc:
            raise InputError(f"not valid JSON: {exc.msg}", path=source, line=exc.lineno) from exc
    for key, value in (overrides or {}).items():
        if value is None:
            continue
        target = data
        *parents, leaf = key.split(".")
        for p in parents:
            if isinstance(target, dict):
                target = target.setdefault(p, {})
        if isinstance(target, dict):  # else the file's `[p]` is not a table: validate names it
            target[leaf] = value
    return from_dict(data, source=source)


def tokens_per_question(cfg: RunConfig) -> int:
    """The engine tokens one question is expected to cost under this config's decoding (a run's ETA, the
    demo's size and time estimate)."""
    constrained = cfg.toc.constrain_format or cfg.answer.constrain_quotes
    return CONSTRAINED_TOKENS_PER_QUESTION if constrained else TOKENS_PER_QUESTION


def calls_per_question(cfg: RunConfig) -> int:
    """The LLM calls one question is expected to have computed under this config's decoding (a run's ETA,
    the demo's time estimate)."""
    constrained = cfg.toc.constrain_format or cfg.answer.constrain_quotes
    return CONSTRAINED_CALLS_PER_QUESTION if constrained else CALLS_PER_QUESTION
