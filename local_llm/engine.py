"""The engine contract (docs/architecture.md#engines-and-the-completion-cache): what every stage that generates text depends on.

Pure module: no vllm/torch import, so `batch/` and tests import it in milliseconds.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol, runtime_checkable

from clarify.options import setting


@dataclass(frozen=True)
class GenParams:
    """Sampling settings of one request. `choices` constrains the output to one of the strings;
    `grammar` constrains it to the language of an EBNF grammar in the GBNF syntax (batch/toc/format.py and
    batch/toc/constraints.py build them). Both are engine-neutral: each backend translates them into its
    server's dialect, or refuses what it cannot honour (local_llm/backends.py). Both are part of the request,
    hence of its cache key (`request_key`)."""

    # `clarify generate`'s flags are generated from these (local_llm/cli.py), so its defaults are a run's
    temperature: float = setting(0.0, help="sampling temperature (>= 0); 0: greedy", flag="--temperature")
    top_p: float = setting(1.0, help="nucleus sampling: the smallest set of tokens holding this probability mass, "
                                     "in (0, 1]", flag="--top-p")
    max_tokens: int = setting(256, help="most tokens generated per prompt (>= 1)", flag="--max-tokens")
    stop: tuple[str, ...] = ()
    seed: int | None = setting(None, help="sampling seed of every request (reproducible sampling); unset: unseeded",
                               flag="--seed")
    n: int = 1
    choices: tuple[str, ...] | None = None
    grammar: str | None = None

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")
        if self.n < 1:
            raise ValueError(f"n must be >= 1, got {self.n}")
        # Lists from TOML/JSON become tuples so the params stay hashable.
        object.__setattr__(self, "stop", tuple(self.stop))
        if self.choices is not None:
            if not self.choices:
                raise ValueError("choices, when given, must name at least one string")
            object.__setattr__(self, "choices", tuple(self.choices))
        if self.grammar is not None and self.choices is not None:
            raise ValueError("choices and grammar are two constraints: give one")
        if self.grammar is not None and not self.grammar.strip():
            raise ValueError("grammar, when given, must not be empty")

    def as_dict(self) -> dict:
        """The params as the cache key sees them. `grammar` only when set: a request without one keeps
        the key it had before constrained decoding added the field, so existing caches stay valid."""
        d = asdict(self)
        if d["grammar"] is None:
            del d["grammar"]
        return d


@dataclass(frozen=True)
class Completion:
    """The result of one prompt: `n` texts plus accounting."""

    texts: tuple[str, ...]
    finish_reason: str  # "stop" | "length" | other engine-specific reasons
    prompt_tokens: int
    output_tokens: int
    cached: bool = False
    extra: dict = field(default_factory=dict, compare=False)

    @property
    def text(self) -> str:
        return self.texts[0]


@runtime_checkable
class Engine(Protocol):
    """Anything that turns a batch of prompts into completions, one `generate` call per batch."""

    model_id: str

    def generate(self, prompts: Sequence[str], params: Sequence[GenParams]) -> list[Completion]: ...


@runtime_checkable
class EngineInfo(Protocol):
    """What a served engine tells its callers beyond `generate` (VLLMEngine answers all of it): the
    scheduler's context check (`count_tokens`, `max_model_len`) and admission bound (`capacity`), the run
    summary's facts (device, dtype really run, CPU) and usage counters (`engine_stats`: steps, running
    batch sizes, prefix-cached prompt tokens), and a progress callback `on_progress(requests, tokens)`.
    `CachedEngine` — the engine every run holds — declares it too and forwards to the engine it wraps,
    with None where that engine cannot tell (a scripted engine): callers never unwrap engines."""

    max_model_len: int | None
    on_progress: Callable[[int, int], None] | None

    def count_tokens(self, prompt: str) -> int | None: ...

    def capacity(self) -> int | None: ...

    def facts(self) -> dict | None: ...

    @property
    def engine_stats(self) -> Any: ...


class NoEngineInfo:
    """EngineInfo of an engine that can tell none of it (the scripted engines): every answer is None."""

    max_model_len: int | None = None
    on_progress: Callable[[int, int], None] | None = None
    engine_stats = None

    def count_tokens(self, prompt: str) -> int | None:
        return None

    def capacity(self) -> int | None:
        return None

    def facts(self) -> dict | None:
        return None


@dataclass(frozen=True)
class Request:
    """One request for an engine's step loop: the caller's id, prompt, params; lower priority = sooner."""

    rid: str
    prompt: str
    params: GenParams
    priority: int = 0


@runtime_checkable
class StepEngine(Protocol):
    """An engine driven request by request (vLLM's own `add_request` / `step` loop): requests go in
    whenever the caller has them, each comes back from the `step()` that finishes it."""

    model_id: str

    def submit(self, requests: Sequence[Request]) -> None: ...

    def step(self) -> list[tuple[str, Completion]]: ...

    def pending(self) -> int: ...

    def cancel(self) -> None: ...


class BatchStepper:
    """A StepEngine over any batch Engine: each `step()` sends everything submitted since the last one
    in ONE `generate` call. Lets scripted engines (and engines without a step loop) serve the
    continuous scheduler; with vLLM the real step loop is used instead."""

    def __init__(self, engine: Engine):
        self.engine, self.model_id = engine, engine.model_id
        self._queue: list[Request] = []

    def submit(self, requests: Sequence[Request]) -> None:
        self._queue.extend(requests)

    def step(self) -> list[tuple[str, Completion]]:
        batch, self._queue = self._queue, []
        if not batch:
            return []
        out = self.engine.generate([r.prompt for r in batch], [r.params for r in batch])
        return [(r.rid, c) for r, c in zip(batch, out)]

    def pending(self) -> int:
        return len(self._queue)

    def cancel(self) -> None:
        self._queue = []


def as_step_engine(engine: Engine) -> StepEngine:
    return engine if isinstance(engine, StepEngine) else BatchStepper(engine)


# When set, every engine appends "<prompt tokens> <output tokens>" per batch of finished requests to this
# file (the test suite counts its real-engine work there, subprocesses included: tests/conftest.py).
TOKENS_LOG = "CLARIFY_ENGINE_TOKENS_LOG"


def log_tokens(completions: Sequence[Completion]) -> None:
    """Append the completions' token counts to TOKENS_LOG when it is set (VLLMEngine, OpenAIEngine)."""
    if path := os.environ.get(TOKENS_LOG):
        with open(path, "a", encoding="utf-8") as fh:
            fh.write(f"{sum(c.prompt_tokens for c in completions)} {sum(c.output_tokens for c in completions)}\n")


def request_key(model_id: str, prompt: str, params: GenParams) -> str:
    """Content address of one request: sha256 over (model id, prompt, sampling params)."""
    payload = json.dumps(
        {"model": model_id, "prompt": prompt, "params": params.as_dict()},
        sort_keys=True,
        ensure_ascii=False,
    )
    return hashlib.sha256(payload.encode("utf-8")).hexdigest()
