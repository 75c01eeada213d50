"""The run configuration's schema: frozen dataclasses, one per table, each setting declared once in its
field (type, default, help, flag, allowed values, whether it changes results), checked on construction.
Read from TOML by batch/config/load.py, written once into the run directory (`config.json`).

Defaults are the Tree of Clarifications paper's (Kim et al., EMNLP 2023, §3 and appendix A) and its
official code (gankim/tree-of-clarifications `run_toc.py` argparse defaults). Where clarify can do
something differently from the official code, a named switch chooses, and its default is the official
behaviour (docs/fidelity.md); `batch/config/previous.toml` restores the choices clarify made before these
switches existed.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import typing
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

from clarify.batch.toc.format import Parsing
from clarify.batch.toc.match import MatchRule
from clarify.errors import InputError, redacted
from clarify.eval import datasets
from clarify.eval.datasets.asqa import pool_spec_problem
from clarify.index.search import CANDIDATES, SearcherKind
from clarify.local_llm import backends
from clarify.options import as_declared, is_choice, problem, setting, spec, toml_value

PART_TREES = 64  # finished trees per checkpoint part (batch/run/rundir.py), unless a minute passes first



class Scheduler(StrEnum):
    """How trees are driven (batch/run/scheduler.py DRIVERS: one driver each). It never changes results: tables
    are identical under each, so it is a setting a run may change when resumed (declared `result_free`:
    RunDir.freeze leaves RESULT_FREE out of the comparison)."""

    CONTINUOUS = "continuous"
    WAVES = "waves"
    SEQUENTIAL = "sequential"


SCHEDULERS = tuple(s.value for s in Scheduler)  # `--scheduler` and the config's choices


# The choice settings: a field whose type is one of these StrEnums takes exactly its values (options.Spec
# derives the choices from the type). A member equals its string, so config.json and TOML hold the plain
# value; each value's meaning is the help of the field that takes it.
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


@dataclass(frozen=True)
class RetrievalConfig:
    candidates: int = setting(CANDIDATES, help="per retriever before fusion (run_toc.py --top_k_docs 100)", lo=1,
                              unit="passages")
    top_k: int = setting(5, help="passages in each prompt (run_toc.py --top_k_reranked 5)", lo=1, unit="passages")
    pool: int = setting(100, help="passages retrieved per search (run_toc.py --top_k_docs 100, toc/rac.py:5)", lo=1,
                        unit="passages")
    searcher: SearcherKind = setting(SearcherKind.RERANK, help="bm25 | dense | hybrid | rerank")
    node_passages: NodePassages = setting(
        NodePassages.POOL, help="\"pool\": the question is searched once and every node reranks that pool (minus "
                                "exhausted passages) by its own question (run_toc.py:198-199, :219 get_example → "
                                "rerank); \"search\": every node searches the index again with its own question "
                                "(clarify before this switch existed).")
    # It changes every ranking, so it is part of the frozen config.
    cross_encoder: str = setting("", help="local sentence-transformers CrossEncoder directory reranking the retrieved "
                                          "passages; empty: the dense encoder's cosine", flag="--cross-encoder",
                                 metavar="DIR",
                                 doc="A local sentence-transformers CrossEncoder directory reranking the fused "
                                     "candidates and every node's pool (run_toc.py:164 dsp's cross-encoder); empty: "
                                     "the dense encoder's cosine (docs/retrieval.md#searchers-and-the-reranker). It "
                                     "changes every ranking, so it is part of the frozen config.")
    faiss_index: str = setting("", help="a Pyserini FAISS directory (files index + docid) to search with --index, "
                                        "e.g. a prebuilt DPR index; empty: the index's own dense part",
                               flag="--faiss-index", metavar="DIR",
                               doc="Attached to `index` (a clarify index or a prebuilt Pyserini Lucene index) from "
                                   "elsewhere (docs/retrieval.md): a Pyserini FAISS directory (`index` + `docid`) "
                                   "and the query encoder that goes with it (a sentence-transformers folder, or a "
                                   "Hugging Face DPRQuestionEncoder folder as for Pyserini's DPR indexes). Empty: "
                                   "the index's own dense part and encoder (none for a prebuilt Lucene index: BM25 "
                                   "only).")
    encoder: str = setting("", help="the query encoder of --faiss-index: a sentence-transformers folder or a Hugging "
                                    "Face DPRQuestionEncoder folder; empty: the index's own", flag="--encoder",
                           metavar="DIR")
    nprobe: int = setting(0, help="IVF lists searched per query; 0: the index's", flag="--nprobe", metavar="N", lo=0)
    ef_search: int = setting(0, help="HNSW efSearch; 0: the index's", flag="--ef-search", metavar="N", lo=0)

    def __post_init__(self) -> None:
        _settle(self, "retrieval")


@dataclass(frozen=True)
class TocConfig:
    max_depth: int = setting(3, help="--max_depth", lo=1)
    max_nodes: int = setting(10, help="--max_nodes: stop once this many valid nodes exist", lo=1)
    max_expansions: int = setting(15, help="`n_expansions <= 15` in run_toc.py", lo=1)
    max_restarts: int = setting(3, help="--max_trials", lo=1)
    undo_pruning_after: int = setting(10, help="run_toc.py: pruning is switched off after 10 fruitless expansions",
                                      lo=0)
    verify: bool = setting(True, help="self-verification pruning (run_toc.py --verify); the flag switches it off",
                           flag="--no-verify", switch=False)
    n_demos: int = setting(5, help="--n_shot", lo=1)
    # vLLM SamplingParams accepts any temperature >= 0; [0, 2] is the range of the OpenAI API that dsp
    # (and so the official ToC code) calls, and above 2 sampling is noise.
    temperature: float = setting(0.7, help="--temperature (clarification)", lo=0, hi=2)
    clarify_max_tokens: int = setting(256, help="the longest clarification completion", lo=1, unit="tokens")
    verify_max_tokens: int = setting(3, help="the longest verification completion (a yes or a no)", lo=1,
                                     unit="tokens")
    answer_max_tokens: int = setting(320, help="the longest answer completion", lo=1, unit="tokens")
    answer_nodes: int = setting(10, help="DQ/DA pairs in the answer prompt (_get_tree(max_nodes))", lo=1)
    answer_passages: int = setting(5, help="passages in the answer prompt (--top_k_reranked)", lo=1)
    # --- where clarify may differ from the official code (defaults = official) ---
    duplicates: Duplicates = setting(
        Duplicates.OFFICIAL, help="\"official\": toc/pruning.py:7-15 check_unique, only while pruning, against "
                                  "earlier valid nodes; \"strict\": clarify's rule (question repeats, or answers all "
                                  "covered), also without pruning.")
    removal: Removal = setting(
        Removal.OFFICIAL, help="\"official\": run_toc.py:94-123 over the whole demo pool and the passages as the "
                               "retriever has them (title and text), matching whole DA strings; \"shown\": only the "
                               "demos shown, text only, split answers.")
    answer_passages_from: AnswerPassagesFrom = setting(
        AnswerPassagesFrom.POOL, help="\"pool\": rerank the question's own retrieved pool by the question "
                                      "(run_toc.py:259); \"nodes\": one answer-containing passage per valid node, "
                                      "then the question's top passages.")
    restart_resample: bool = setting(
        False, help="False: the clarification seed is a function of the prompt, so a byte-identical re-expansion "
                    "(after a restart) gets the cached completion, as the official run does through dsp's request "
                    "cache; True: the seed includes the node and expansion count, every expansion samples afresh.")
    evidence: Evidence = setting(
        Evidence.FILTER, help="\"filter\": the intended get_evidence (toc/pruning.py:17-25): shown passages "
                              "containing the answer, top-1 by the reranker; \"official\": as published, the DA "
                              "string's single characters are the answers (a no-op for most answers, not for e.g. "
                              "\"16\"); \"filter-embed\": the filter, scored by the dense encoder's cosine "
                              "(clarify's earlier behaviour).")
    matching: MatchRule = setting(
        MatchRule.DSP, help="\"dsp\": the tree's answer matching (a passage holds an answer, F1 of two answers) as the "
                            "official code's dsp has it (batch/toc/match.py); \"squad\": the metrics' ASQA/SQuAD "
                            "normalisation, whitespace tokens, an empty answer matches nothing and two empty answers "
                            "have F1 1 (clarify's earlier behaviour).")
    empty_tree_answer: EmptyTreeAnswer = setting(
        EmptyTreeAnswer.OPEN, help="\"open\": a free-style answer prompt of a tree without valid nodes ends open at "
                                   "`Disambiguations:`, as the official template renders an empty DQ/DA field "
                                   "(toc/tree.py:32-40, dsp/templates/template_v2.py:73-83); \"closed\": it asks "
                                   "for the answer directly (clarify's earlier behaviour).")
    parsing: Parsing = setting(
        Parsing.CLARIFY, help="\"clarify\": every DQ/DA pair the official parser finds (toc/utils.py:25-46), with "
                              "its text, plus pairs from the lines it drops (batch/toc/format.py); \"official\": "
                              "exactly the official parser's pairs.")
    constrain_format: bool = setting(False, help="decode clarifications under a grammar of the DQ/DA format; off: "
                                                 "the official free decoding", flag="--constrain-format", switch=True,
                                     constraint="format",
                                     doc="True: each clarification is decoded under a grammar of the official "
                                         "DQ/DA format, so it parses (batch/toc/format.py format_grammar; "
                                         "docs/running-toc.md). False: free decoding, as the official code.")

    def __post_init__(self) -> None:
        _settle(self, "toc")


@dataclass(frozen=True)
class AnswerConfig:
    """The final answer step (its style is the top-level `answer_style`)."""

    constrain_quotes: bool = setting(False, help="decode quoted answers so every [k span] is a run of source k's "
                                                 "words", flag="--constrain-quotes", switch=True, constraint="quotes",
                                     doc="True: in the quoted style, the text of each `[k ...]` marker is decoded "
                                         "under a grammar that only allows runs of source k's words, so every quote "
                                         "is verbatim by construction (batch/toc/constraints.py quotes_grammar; "
                                         "docs/running-toc.md). False: free decoding, the checker repairs or "
                                         "unmarks.")

    def __post_init__(self) -> None:
        _raise(_problems_of(self, "answer"), "config")


@dataclass(frozen=True)
class ModelConfig(backends.Options):
    """The `[model]` table: the engine's options (local_llm/settings.py EngineOptions) and the openai client's
    (local_llm/openai_http.py ClientOptions), declared there with their defaults, and the run's own two.
    One flat table, so config.json keeps the keys it always had."""

    stop: tuple[str, ...] = setting((), help="extra stop strings (base models without a chat template)")
    backend: str = setting("vllm", help="which engine (local_llm/backends.py): \"vllm\" starts vLLM in this "
                                        "process; \"openai\" talks to a running OpenAI-compatible server at "
                                        "base_url (`model` is then the name it serves; empty: its only model)",
                           choices=backends.names)

    def __post_init__(self) -> None:
        if isinstance(self.stop, list):
            object.__setattr__(self, "stop", tuple(self.stop))
        _raise(_problems_of(self, "model"), "config")


@dataclass(frozen=True)
class ClusterConfig:
    """Ray scale-out (batch/run/cluster.py, docs/scale.md#running-on-a-cluster); never changes results: where the
    trees run, every setting here is `result_free`."""

    workers: int = setting(0, help="run the trees on N Ray workers, one engine each (a GPU, a tensor-parallel "
                                   "group, or CPU cores); 0: in this process", flag="--workers", metavar="N", lo=0,
                           result_free=True)
    ray_address: str = setting("", help="join a running Ray cluster ('auto', or HOST:PORT of `ray start --head`) "
                                        "instead of starting a local one, where --workers defaults to its GPUs / "
                                        "tensor_parallel_size; empty: a local Ray cluster for this run",
                               flag="--ray-address", metavar="ADDR", result_free=True)
    chunk_questions: int = setting(64, help="questions handed to a worker at a time; each finished chunk is one part",
                                   flag="--chunk-questions", metavar="N", lo=1, result_free=True)
    cores_per_worker: int = setting(0, help="CPU engines: cores bound per worker; 0 = this machine's cores split "
                                            "evenly", lo=0, result_free=True)

    def __post_init__(self) -> None:
        _raise(_problems_of(self, "cluster"), "config")


@dataclass(frozen=True)
class RunConfig:
    dataset: str = setting("asqa", help="question set", flag="--dataset",
                           choices=datasets.names)  # the registry (eval/datasets/), datasets registered later too
    questions: str = setting("", help="questions file: JSONL {qid, question} for --dataset jsonl; for asqa an "
                                      "official-layout ASQA.json, whose train split is then the demo pool; empty: "
                                      "the dataset's shipped dev set (asqa, quotesum)", flag="--questions")
    offset: int = setting(0, help="skip the first N questions", flag="--offset", lo=0)
    limit: int = setting(20, help="answer N questions; 0 = all: for asqa every dev question, or with the shipped "
                                  "dev-only file every one outside the demo pool dev 500-947", flag="--limit", lo=0)
    seed: int = setting(0, help="sampling seed of the run", flag="--seed")
    answer_style: AnswerStyle = setting(AnswerStyle.QUOTED, help="free: the official long answer; quoted: SEMQA [k span] answers",
                                flag="--answer-style")
    index: str = setting("", help="index directory; empty: the embedded Wikipedia index", flag="--index")
    # A run records the pool it used (never "auto") in its config.json.
    demo_pool: str = setting("auto", help="few-shot clarification demos: asqa:train, asqa:dev[500:], either with "
                                          "@FILE; auto: the ASQA file's train split if it has one, else "
                                          "asqa:dev[500:]", flag="--demo-pool", metavar="SPEC",
                             doc="The clarification demos (batch/toc/demos.py): \"auto\" = the train split of the "
                                 "run's ASQA file when it has one, as the official code (run_toc.py:191 `cur_demos "
                                 "= train.copy()`), else dev questions 500..947 (the shipped file has no train "
                                 "split); \"asqa:train\", \"asqa:dev[a:b]\", either with \"@FILE\". A run records the "
                                 "pool it used (never \"auto\") in its config.json.")
    scheduler: Scheduler = setting(Scheduler.CONTINUOUS, help="how trees are driven; recorded, never changes results",
                                   flag="--scheduler", result_free=True)
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


# --- the declared schema ---------------------------------------------------------------------------
# Every setting is declared once, in its field (options.setting): its type is the annotation (int, float,
# bool, str, a StrEnum, tuple[str, ...]); its allowed values, range, help, flag and whether it changes
# results are the field's Spec. `validate` checks a whole raw config against them and raises ONE InputError
# naming every bad field, before anything heavy is loaded; the flags, the configuration page, --print-config
# and the resume comparison (RESULT_FREE) are derived from the same fields.


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    """The declared type of each plain field (RunConfig's sub-tables are checked on their own)."""
    return {k: v for k, v in typing.get_type_hints(cls).items() if cls is not RunConfig or k not in _SECTIONS}


def settings() -> list[tuple[str, dataclasses.Field, Any]]:
    """(config key, field, declared type) of every setting, in the order declared: the top level's, then each
    table's ("toc.max_depth")."""
    return [(f"{section}.{f.name}" if section else f.name, f, _hints(cls)[f.name])
            for section, cls in [("", RunConfig), *_SECTIONS.items()]
            for f in dataclasses.fields(cls) if f.name in _hints(cls)]


def flagged() -> list[tuple[str, dataclasses.Field]]:
    """(config key, field) of every setting declared with a `clarify run` flag (options.setting), in the
    order they are declared: the flags, their help and `commands._overrides` are generated from these."""
    return [(key, f) for key, f, _ in settings() if spec(f).flag]


def choices_of(key: str) -> tuple[str, ...] | None:
    """The allowed values of a choice setting (its declared choices, or its StrEnum's), as its flag offers them."""
    return next((spec(f).allowed(hint) for k, f, hint in settings() if k == key), None)


# The settings that never change results (declared `result_free`): where the trees run (one process, or Ray
# workers: batch/run/cluster.py), how they are driven, and how the openai backend talks to its server (a
# completion it accepts is the same whatever its deadlines, retries or size cap): a resumed run may change
# them (RunDir.freeze leaves them out of the comparison), so a run stopped by a deadline resumes with a
# longer one.
RESULT_FREE = tuple(key for key, f, _ in settings() if spec(f).result_free)
# The decoding constraints, by config key (`clarify demo` decodes under all of them: batch/cli/demo_sizing.py).
CONSTRAINTS = {key: spec(f).constraint for key, f, _ in settings() if spec(f).constraint}


def value_of(cfg: RunConfig, key: str) -> Any:
    """The value of the setting `key` ("toc.max_depth", "seed") in `cfg`."""
    section, _, name = key.rpartition(".")
    return getattr(getattr(cfg, section) if section else cfg, name)


def result_free(key: str) -> bool:
    """Whether the setting `key` ("scheduler", "model.max_retries") never changes results (RESULT_FREE)."""
    return key in RESULT_FREE


def _check_values(values: dict[str, Any], cls: type, section: str) -> list[tuple[str, str]]:
    """(field, problem) for every unknown key, wrong type and out-of-range value of one table."""
    prefix = f"{section}." if section else ""
    hints = _hints(cls)
    out: list[tuple[str, str]] = []
    unknown = sorted(set(values) - set(hints) - (set() if section else set(_SECTIONS)))
    if unknown:
        out.append((section, f"unknown key(s) {unknown}; known: {sorted(hints)}"))
    for f in dataclasses.fields(cls):
        if f.name in hints and f.name in values and (bad := problem(values[f.name], f, hints[f.name])):
            out.append((prefix + f.name, bad))
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
        if is_choice(hint):
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
    """Validated values in their declared Python types (options.as_declared)."""
    return {k: as_declared(v, _hints(cls)[k]) for k, v in values.items()}
