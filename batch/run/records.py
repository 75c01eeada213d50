"""The JSON records of a run directory, each a declared type with one writer and one reader.

    RunInputs    inputs.json: what the run reads (each input's `Pin`) and the fingerprint of its prompts
                 (batch/toc/fingerprint.py); written by `RunDir.freeze`, compared on every resume
    RunSummary   summary.json: what `finalize` (batch/run/pipeline.py) found, written last; read by `Run.open`
                 and handed to every reader as this record (its JSON objects read into, such as `tokens` or
                 `engine`, are records too: `_Part`)

Each carries `schema_version`. A file written before the version existed reads as version 1: inputs.json
then holds the pins alone (no prompts fingerprint) and summary.json the same keys as now. A version newer
than this clarify reads is refused, naming the file.
"""

from __future__ import annotations

import dataclasses
import functools
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from clarify import jsonl
from clarify.errors import InputError
from clarify.files import write_json
from clarify.options import JsonObject, declared, spec

INPUTS_SCHEMA = 2  # 1: the pins alone; 2: + schema_version and `prompts`
SUMMARY_SCHEMA = 2  # 1: no schema_version key; 2: the same keys + schema_version
# inputs.json's pins by input name: the model's (its folder or server, local_llm/backends.py identity), and the
# retrieval inputs a Ray worker opens exactly as the driver pinned them (index/fingerprint.py index_pins names
# the attached FAISS folder and encoder)
MODEL = "model"
ATTACHED = ("index", "faiss_index", "encoder")


def read_json(path: Path, what_to_do: str) -> object:
    """A JSON file of the run directory (clarify.jsonl `read_json`); a missing or damaged one is an InputError
    naming it (and the line) and what to do."""
    if not path.exists():
        raise InputError(f"missing; {what_to_do}", path=str(path))
    try:
        return jsonl.read_json(path)
    except InputError as exc:
        raise InputError(f"damaged ({exc.reason}); {what_to_do}", path=str(path), line=exc.line) from None


def _object(data: object, source: str) -> dict:
    if not isinstance(data, dict):
        raise InputError(f"expected a JSON object, got {type(data).__name__}", path=source, line=1)
    return data


def _version(data: dict, newest: int, source: str) -> int:
    version = data.get("schema_version", 1)
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise InputError(f"schema_version must be a positive integer, got {version!r}", path=source,
                         field="schema_version")
    if version > newest:
        raise InputError(f"written by a newer clarify (schema_version {version}; this one reads up to {newest}); "
                         f"use that clarify", path=source, field="schema_version")
    return version


class _Record:
    """One writer and one reader of a record's JSON file (`to_json` / `from_json` say what is in it)."""

    def to_json(self) -> dict:
        raise NotImplementedError

    @classmethod
    def from_json(cls, data: object, source: str) -> Any:
        raise NotImplementedError

    def write(self, path: Path) -> None:
        write_json(self.to_json(), path)

    @classmethod
    def read(cls, path: Path, what_to_do: str) -> Any:
        """The record in `path`; a missing or damaged file is an InputError naming it and `what_to_do`."""
        return cls.from_json(read_json(path, what_to_do), str(path))


@dataclass(frozen=True)
class _Part(JsonObject):
    """A JSON object inside a record (options.JsonObject: declared keys typed, the others in `extra`, its keys'
    order kept)."""

    @classmethod
    def from_json(cls, data: object, source: str, name: str) -> Any:
        """The part at key `name` of the record in `source`; not a JSON object: an InputError naming both."""
        if not isinstance(data, dict):
            raise InputError(f"{name} must be a JSON object, got {type(data).__name__}", path=source, field=name)
        return cls.of(data)


@dataclass(frozen=True)
class Pin(_Part):
    """One input's pin in inputs.json (batch/run/resources.py `prepare`): where it is and what identifies its
    content, compared on every resume (batch/run/rundir.py input_changes: `sha256` or `fingerprint`, never the
    path alone). Each input has the keys of its maker; a key none declares stays in `extra`."""

    path: str | None = None  # questions, demo_pool, index, faiss_index, encoder, cross_encoder, a model folder
    sha256: str | None = None  # a file's (questions, demo_pool)
    fingerprint: str | None = None  # a folder's (index/fingerprint.py, local_llm/models.py model_fingerprint)
    spec: str | None = None  # demo_pool: the pool's spec (batch/toc/demos.py Pool.identity)
    demos: int | None = None  # demo_pool: its demos
    kind: str | None = None  # encoder: its kind (index/dense.py encoder_kind)
    name: str | None = None  # model: an embedded model's name
    backend: str | None = None  # model: "openai" for a server (local_llm/backends.py identity)
    base_url: str | None = None  # model: the server's address, without credentials
    served_model: str | None = None  # model: the id the server reports


@dataclass(frozen=True)
class Tokens(_Part):
    """summary.json `tokens`: prompt and output tokens of every llm_calls row."""

    prompt: int = 0
    output: int = 0


@dataclass(frozen=True)
class Constraints(_Part):
    """summary.json `constraints`: which decoding constraints the run had on (batch/toc/constraints.py)."""

    format: bool = False
    quotes: bool = False


@dataclass(frozen=True)
class EngineFacts(_Part):
    """summary.json `engine`: what the engine reported (its `facts()`, local_llm/engine.py); the keys one
    backend adds (a CPU's capability, a server's address, the vLLM and torch versions) stay in `extra`."""

    model_id: str | None = None
    device: str | None = None  # "cpu", "cuda", "server", "replay", "simulated"
    dtype: str | None = None  # the dtype really run (vLLM)
    device_count: int | None = None  # the GPUs, or CPU cores, the engine held (device-seconds = wall x this)
    backend: str | None = None  # "openai" for a server; absent for vLLM in process


@dataclass(frozen=True)
class PeakMemory(_Part):
    """summary.json `peak_memory_last_session` (local_llm/hardware.py peak_memory): bytes, None where unknown."""

    rss_bytes: int | None = None
    gpu_bytes: int | None = None


@dataclass(frozen=True)
class QuoteFidelity(_Part):
    """summary.json `quote_fidelity` (batch/toc/quotes.py quote_fidelity, where each key is defined): counts of
    spans by status and shares of all spans; the counts of the other statuses stay in `extra`."""

    n_spans: int | None = None
    n_verbatim: int | None = None
    n_answers: int | None = None
    n_answers_with_spans: int | None = None
    share_verbatim: float | None = None
    share_verbatim_after_repair: float | None = None
    share_answers_without_spans: float | None = None


@dataclass(frozen=True)
class EngineUsage(_Part):
    """summary.json `engine_usage_last_session` (batch/run/pipeline.py engine_usage): the scheduler's calls, and for
    an engine that counts its steps, the steps, the running batch and the prefix cache's share."""

    generate_calls: int | None = None
    scheduler_step_calls: int | None = None
    engine_steps: int | None = None
    running_mean: float | None = None
    running_p10: float | None = None
    running_p50: float | None = None
    running_p90: float | None = None
    prefix_cached_share: float | None = None


@dataclass(frozen=True)
class CacheRecomputed(_Part):
    """summary.json `cache_recomputed` (local_llm/cache.py recomputed): completion-cache rows found damaged."""

    rows: int = 0
    reasons: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class WorkerWork(_Part):
    """One worker's share of summary.json `cluster` (batch/run/cluster.py `_write` counts it)."""

    slot: int | None = None
    node: str | None = None  # the host it ran on
    chunks: int = 0  # parts it wrote this session
    trees: int = 0
    engine_tokens: int = 0  # prompt + output tokens its engine computed (cache hits excluded)


@dataclass(frozen=True)
class ClusterWork(_Part):
    """summary.json `cluster` (batch/run/cluster.py Outcome.summary): what a cluster run's workers did this session."""

    workers: int | None = None
    chunks: int | None = None
    requeued: int | None = None
    restarts: int | None = None
    engine_tokens: int | None = None
    engine_tokens_per_s_all_workers: float | None = None
    per_worker: list[WorkerWork] | None = None

    @classmethod
    def of(cls, data: dict | None) -> Any:
        work = super().of(data)
        if work is None or work.per_worker is None:
            return work
        return dataclasses.replace(work, per_worker=[w if isinstance(w, WorkerWork) else WorkerWork.of(w)
                                                     for w in work.per_worker])

    def to_json(self) -> dict:
        out = super().to_json()
        if self.per_worker is not None:
            out["per_worker"] = [w.to_json() for w in self.per_worker]
        return out


@dataclass(frozen=True)
class RanOn(_Part):
    """A cluster run's part: state.json `ran_on` (batch/run/cluster.py `_write`), where its trees ran."""

    worker: int | None = None  # the worker's slot
    node: str | None = None  # the host it ran on
    qids: list[str] = field(default_factory=list)  # the chunk's question ids


@dataclass(frozen=True)
class PartState(_Part):
    """A checkpoint part's state.json (batch/run/rundir.py write_part writes it, verify_part checks it): the
    part's number, the run's seconds up to it, its finished trees (batch/toc/tree.py Tree.to_dict), each
    table's sha256, the engine's facts and, for a cluster run, where its trees ran; `checksum` covers the rest."""

    part: int | None = None
    run_s: float | None = None
    trees: list[dict] = field(default_factory=list)
    files: dict[str, str] = field(default_factory=dict)  # table file -> sha256
    engine: dict | None = None
    ran_on: RanOn | None = None  # a cluster run's worker, node and question ids (batch/run/cluster.py)
    checksum: str | None = None

    @classmethod
    def of(cls, data: dict | None) -> Any:
        state = super().of(data)
        if state is None or state.ran_on is None or isinstance(state.ran_on, RanOn):
            return state
        return dataclasses.replace(state, ran_on=RanOn.of(state.ran_on))


@functools.cache
def _part_fields(cls: type) -> dict[str, type[_Part]]:
    """The fields of record `cls` that hold a `_Part`, by name, as their declared types say."""
    hints = typing.get_type_hints(cls)
    return {f.name: t for f in dataclasses.fields(cls) for t in typing.get_args(hints[f.name])
            if isinstance(t, type) and issubclass(t, _Part)}


@dataclass(frozen=True)
class RunInputs(_Record):
    """inputs.json. `pins`: each input's pin by name (questions, demo_pool, index, model, ...: a `Pin`, a path and
    its sha256 or fingerprint, batch/run/resources.py `prepare`); `prompts`: {component: sha256} of the code that
    makes the requests and reads the completions (batch/toc/fingerprint.py), None in a version-1 file."""

    pins: dict[str, Pin] = field(default_factory=dict)
    prompts: dict[str, str] | None = None
    schema_version: int = INPUTS_SCHEMA

    def __post_init__(self):  # pins given as their JSON objects (a caller's dict) are read into Pins
        object.__setattr__(self, "pins", {k: v if isinstance(v, Pin) else Pin.of(v) for k, v in self.pins.items()})

    def to_json(self) -> dict:
        """The file's content: the pins at the top level (as version 1 had them), then the rest."""
        out: dict[str, Any] = {**{k: p.to_json() for k, p in self.pins.items()}, "schema_version": self.schema_version}
        if self.prompts is not None:
            out["prompts"] = self.prompts
        return out

    @classmethod
    def from_json(cls, data: object, source: str) -> RunInputs:
        data = _object(data, source)
        version = _version(data, INPUTS_SCHEMA, source)
        prompts = data.get("prompts")
        if prompts is not None and not (isinstance(prompts, dict) and all(isinstance(v, str) for v in prompts.values())):
            raise InputError("prompts must map each component to its sha256", path=source, field="prompts")
        bad = [(k, v) for k, v in data.items() if k not in ("schema_version", "prompts") and not isinstance(v, dict)]
        if bad:
            raise InputError(f"an input's pin must be a JSON object, got {type(bad[0][1]).__name__}", path=source,
                             field=bad[0][0])
        pins = {k: Pin.from_json(v, source, k) for k, v in data.items() if k not in ("schema_version", "prompts")}
        return cls(pins, prompts, version)


@dataclass(frozen=True)
class RunSummary(_Record):
    """summary.json: the run's results and what it cost. Every key is documented where `finalize` computes it."""

    name: str | None = None
    dataset: str | None = None
    model: str | None = None
    engine_model_id: str | None = None  # the model id of the completions (local_llm/engine.py request_key)
    engine: EngineFacts | None = None  # the engine's facts (device, dtype), None without a real engine
    answer_style: str | None = None
    n_questions: int | None = None
    metrics: dict[str, float | None] = field(default_factory=dict)  # eval/summary.py score_predictions
    metric_notes: dict[str, str] | None = None  # how each metric was aggregated, or why it is missing
    constraints: Constraints | None = None  # the decoding constraints (batch/toc/constraints.py)
    llm_calls: int | None = None
    llm_calls_per_question: float | None = None
    llm_calls_per_question_max: int | None = None
    llm_calls_by_step: dict[str, int] | None = None
    cached_calls: int | None = None
    tokens: Tokens | None = None
    parse_errors: int | None = None
    prompts_too_long: int | None = None
    scheduler: str | None = None
    parts: int | None = None
    engine_usage_last_session: EngineUsage | None = None
    valid_nodes_per_question: float | None = None
    max_depth: int | None = None
    node_status: dict[str, int] | None = None
    wall_s_last_session: float | None = None
    wall_s_total: float | None = None  # None when an earlier session's time was lost
    seconds_last_session: dict[str, float] | None = None
    engine_tokens_per_s: float | None = None
    peak_memory_last_session: PeakMemory | None = None
    cache_recomputed: CacheRecomputed | None = None
    quote_fidelity: QuoteFidelity | None = None
    params: int | None = None  # the model's parameter count (local_llm/models.py parameter_count)
    # written only when the session has them (options.Spec omit_none): absent otherwise
    cluster: ClusterWork | None = declared(None, omit_none=True, help="a cluster run's workers (batch/run/cluster.py "
                                                               "Outcome.summary)")
    toc_s_last_session: float | None = declared(None, omit_none=True, unit="s",
                                                help="this session's seconds of trees in this process")
    extra: dict[str, Any] = field(default_factory=dict)  # keys this clarify does not declare, kept as read
    schema_version: int = SUMMARY_SCHEMA

    def to_json(self) -> dict:
        """The file's content: every declared key (one declared `omit_none` only when set), then `extra`."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
               if f.name != "extra" and not (spec(f).omit_none and getattr(self, f.name) is None)}
        out.update({k: out[k].to_json() for k in _part_fields(type(self)) if out.get(k) is not None})
        return {**self.extra, **out}

    @classmethod
    def from_json(cls, data: object, source: str) -> RunSummary:
        data = _object(data, source)
        version = _version(data, SUMMARY_SCHEMA, source)
        names = {f.name for f in dataclasses.fields(cls)} - {"extra", "schema_version"}
        if not isinstance(data.get("metrics", {}), dict):
            raise InputError("metrics must be a JSON object", path=source, field="metrics")
        declared = {k: v for k, v in data.items() if k in names}
        declared.update({k: part.from_json(declared[k], source, k) for k, part in _part_fields(cls).items()
                         if declared.get(k) is not None})
        return cls(**declared,
                   extra={k: v for k, v in data.items() if k not in names and k != "schema_version"},
                   schema_version=version)
