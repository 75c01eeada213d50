"""The JSON records of a run directory, each a declared type with one writer and one reader.

    RunInputs    inputs.json: what the run reads (each input's pin) and the fingerprint of its prompts
                 (batch/toc/fingerprint.py); written by `RunDir.freeze`, compared on every resume
    RunSummary   summary.json: what `finalize` (batch/pipeline.py) found, written last; read by `Run.open`

Each carries `schema_version`. A file written before the version existed reads as version 1: inputs.json
then holds the pins alone (no prompts fingerprint) and summary.json the same keys as now. A version newer
than this clarify reads is refused, naming the file.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from clarify import jsonl
from clarify.errors import InputError
from clarify.files import write_json

INPUTS_SCHEMA = 2  # 1: the pins alone; 2: + schema_version and `prompts`
SUMMARY_SCHEMA = 2  # 1: no schema_version key; 2: the same keys + schema_version


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
class RunInputs(_Record):
    """inputs.json. `pins`: each input's pin by name (questions, demo_pool, index, model, ...: a path and its
    sha256 or fingerprint, batch/resources.py `prepare`); `prompts`: {component: sha256} of the code that
    makes the requests and reads the completions (batch/toc/fingerprint.py), None in a version-1 file."""

    pins: dict[str, dict] = field(default_factory=dict)
    prompts: dict[str, str] | None = None
    schema_version: int = INPUTS_SCHEMA

    def to_json(self) -> dict:
        """The file's content: the pins at the top level (as version 1 had them), then the rest."""
        out: dict[str, Any] = {**self.pins, "schema_version": self.schema_version}
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
        pins = {k: v for k, v in data.items() if k not in ("schema_version", "prompts")}
        bad = [k for k, v in pins.items() if not isinstance(v, dict)]
        if bad:
            raise InputError(f"an input's pin must be a JSON object, got {type(pins[bad[0]]).__name__}", path=source,
                             field=bad[0])
        return cls(pins, prompts, version)


# summary.json keys written only when the session has them (a cluster run's workers, trees made in this process)
OPTIONAL = ("cluster", "toc_s_last_session")


@dataclass(frozen=True)
class RunSummary(_Record):
    """summary.json: the run's results and what it cost. Every key is documented where `finalize` computes it."""

    name: str | None = None
    dataset: str | None = None
    model: str | None = None
    engine_model_id: str | None = None  # the model id of the completions (local_llm/engine.py request_key)
    engine: dict | None = None  # the engine's facts (device, dtype), None without a real engine
    answer_style: str | None = None
    n_questions: int | None = None
    metrics: dict[str, float | None] = field(default_factory=dict)  # eval/summary.py score_predictions
    metric_notes: dict[str, str] | None = None  # how each metric was aggregated, or why it is missing
    constraints: dict[str, bool] | None = None  # the decoding constraints (batch/toc/constraints.py)
    llm_calls: int | None = None
    llm_calls_per_question: float | None = None
    llm_calls_per_question_max: int | None = None
    llm_calls_by_step: dict[str, int] | None = None
    cached_calls: int | None = None
    tokens: dict[str, int] | None = None  # {"prompt": n, "output": n}
    parse_errors: int | None = None
    prompts_too_long: int | None = None
    scheduler: str | None = None
    parts: int | None = None
    engine_usage_last_session: dict | None = None
    valid_nodes_per_question: float | None = None
    max_depth: int | None = None
    node_status: dict[str, int] | None = None
    wall_s_last_session: float | None = None
    wall_s_total: float | None = None  # None when an earlier session's time was lost
    seconds_last_session: dict[str, float] | None = None
    engine_tokens_per_s: float | None = None
    peak_memory_last_session: dict | None = None  # local_llm/hardware.py peak_memory
    cache_recomputed: dict | None = None
    quote_fidelity: dict | None = None
    params: int | None = None  # the model's parameter count (local_llm/models.py parameter_count)
    cluster: dict | None = None  # a cluster run's workers (batch/cluster.py Outcome.summary); absent otherwise
    toc_s_last_session: float | None = None  # this session's seconds of trees in this process; absent otherwise
    extra: dict[str, Any] = field(default_factory=dict)  # keys this clarify does not declare, kept as read
    schema_version: int = SUMMARY_SCHEMA

    def to_json(self) -> dict:
        """The file's content: every declared key (those of OPTIONAL only when set), then `extra`."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
               if f.name != "extra" and not (f.name in OPTIONAL and getattr(self, f.name) is None)}
        return {**self.extra, **out}

    @classmethod
    def from_json(cls, data: object, source: str) -> RunSummary:
        data = _object(data, source)
        version = _version(data, SUMMARY_SCHEMA, source)
        names = {f.name for f in dataclasses.fields(cls)} - {"extra", "schema_version"}
        if not isinstance(data.get("metrics", {}), dict):
            raise InputError("metrics must be a JSON object", path=source, field="metrics")
        return cls(**{k: v for k, v in data.items() if k in names},
                   extra={k: v for k, v in data.items() if k not in names and k != "schema_version"},
                   schema_version=version)
