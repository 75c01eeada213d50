"""`OpenAIEngine`: a model that already runs as a server speaking the OpenAI-compatible API (`vllm serve`,
SGLang, TGI, llama.cpp's server), as a clarify engine (docs/engines.md#a-running-server-the-openai-backend).

Many requests are in flight at once — async HTTP on one background event loop, at most
`max_concurrency` — so the continuous scheduler keeps the server's batch full: `submit` starts requests,
`step` returns those that finished (the StepEngine contract, local_llm/engine.py). Each request carries
its own `seed`, stop strings, `max_tokens`, temperature and top_p, and its structured output — the
verification's True/False `choice`, or a grammar (batch/toc/constraints.py) — as vLLM's server accepts it (`structured_outputs`,
vllm/entrypoints/openai/chat_completion/protocol.py); top_k, min_p and repetition_penalty are sent as
their neutral values, so a server's generation_config defaults never change the sampling.

Chat models get the prompt as one user message (`/v1/chat/completions`: the server applies the chat
template, as the in-process engine does); `endpoint = "completions"` sends the raw text (base models).

Failures: 429, 5xx, timeouts and connection errors are retried with exponential backoff (1, 2, 4 … s,
at most `max_retries` times); a request's completion is returned once, whatever the retries, so the
completion cache never records one twice. When a request exhausts its retries the step raises
`EngineUnavailable`: the run stops with one line, keeps what finished, and the same command resumes.

Identity: the completion-cache key's model part is `openai:<model id as /v1/models reports it>@<base
url>`, so completions of two served models never mix, and never mix with the in-process engine's.
The API key is read from the environment variable the config names; it is never written anywhere.
"""

from __future__ import annotations

import asyncio
import logging
import os
import queue
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from clarify.errors import EngineUnavailable, InputError
from clarify.local_llm.engine import Completion, GenParams, Request, log_tokens

log = logging.getLogger(__name__)
RETRY_STATUS = {408, 409, 425, 429, 500, 502, 503, 504}


def _headers(api_key_env: str) -> dict[str, str]:
    if not api_key_env:
        return {}
    key = os.environ.get(api_key_env)
    if not key:
        raise InputError(f"the environment variable {api_key_env} (the server's API key) is not set",
                         field="model.api_key_env")
    return {"Authorization": f"Bearer {key}"}


def served_models(base_url: str, api_key_env: str = "", timeout_s: float = 10.0) -> list[str]:
    """The model ids the server at `base_url` serves (`GET /v1/models`); InputError, in one line, when it
    does not answer or is not an OpenAI-compatible server."""
    import httpx

    url = base_url.rstrip("/") + "/models"
    try:
        r = httpx.get(url, headers=_headers(api_key_env), timeout=timeout_s)
        r.raise_for_status()
        return [m["id"] for m in r.json()["data"]]
    except httpx.HTTPStatusError as exc:
        raise InputError(f"the server answered {exc.response.status_code} to GET {url}"
                         + (" (check [model] api_key_env)" if exc.response.status_code in (401, 403) else ""),
                         field="model.base_url") from None
    except (httpx.HTTPError, ValueError, KeyError, TypeError) as exc:
        raise InputError(f"no OpenAI-compatible server answers at {base_url} ({type(exc).__name__}: {exc}); "
                         f"start it (vllm serve MODEL --port ...) or fix [model] base_url", field="model.base_url") from None


def resolve_served_model(base_url: str, model: str, api_key_env: str = "") -> str:
    """The id the server reports for `model` (the one it serves when `model` is empty); InputError when it
    serves another."""
    ids = served_models(base_url, api_key_env)
    if not model:
        if len(ids) != 1:
            raise InputError(f"the server at {base_url} serves {ids}: name one in [model] model", field="model.model")
        return ids[0]
    if model not in ids:
        raise InputError(f"the server at {base_url} serves {ids}, not {model!r}", field="model.model")
    return model


class OpenAIEngine:
    """Engine, EngineInfo and StepEngine over an OpenAI-compatible HTTP server (module docstring)."""

    def __init__(self, base_url: str, model: str = "", *, api_key_env: str = "", endpoint: str = "chat",
                 max_concurrency: int = 64, request_timeout_s: float = 600.0, max_retries: int = 6,
                 max_model_len: int | None = None, backoff_s: float = 1.0):
        if endpoint not in ("chat", "completions"):
            raise InputError(f"unknown endpoint {endpoint!r}; choose chat or completions", field="model.endpoint")
        self.base_url = base_url.rstrip("/")
        self.served = resolve_served_model(self.base_url, model, api_key_env)
        self.model_id = f"openai:{self.served}@{self.base_url}"
        self.endpoint, self.max_retries, self.backoff_s = endpoint, max_retries, backoff_s
        self.max_concurrency, self.timeout_s = max_concurrency, request_timeout_s
        self.max_model_len = max_model_len  # the scheduler's context check; the server refuses longer ones too
        self.on_progress: Callable[[int, int], None] | None = None
        self._headers = _headers(api_key_env)
        self._done: queue.Queue = queue.Queue()  # (rid, Completion | BaseException)
        self._live: dict[str, Any] = {}  # rid -> concurrent future
        self._error: BaseException | None = None  # a request that failed for good, raised at the next step
        self.stats = {"requests": 0, "retries": 0, "prompt_tokens": 0, "output_tokens": 0, "seconds": 0.0}
        self.server_fingerprint: str | None = None
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="openai-engine", daemon=True)
        self._thread.start()
        self._client = None
        self._sem = None
        asyncio.run_coroutine_threadsafe(self._open(), self._loop).result()

    async def _open(self) -> None:
        import httpx

        self._client = httpx.AsyncClient(base_url=self.base_url, headers=self._headers, timeout=self.timeout_s,
                                         limits=httpx.Limits(max_connections=self.max_concurrency))
        self._sem = asyncio.Semaphore(self.max_concurrency)

    # -- one request ---------------------------------------------------------------------------
    def body(self, prompt: str, params: GenParams) -> tuple[str, dict]:
        """The endpoint and JSON body of one request (vLLM's OpenAI-compatible protocol)."""
        body: dict[str, Any] = {"model": self.served, "n": params.n, "temperature": params.temperature,
                                "top_p": params.top_p, "max_tokens": params.max_tokens, "seed": params.seed,
                                "stop": list(params.stop), "top_k": 0, "min_p": 0.0, "repetition_penalty": 1.0}
        if params.choices is not None:
            body["structured_outputs"] = {"choice": list(params.choices)}
        if params.grammar is not None:  # issue 29's EBNF grammars (batch/toc/constraints.py), as xgrammar reads them
            body["structured_outputs"] = {"grammar": params.grammar}
        if self.endpoint == "chat":
            body["messages"] = [{"role": "user", "content": prompt}]
            return "/chat/completions", body
        body["prompt"] = prompt
        return "/completions", body

    async def _one(self, rid: str, prompt: str, params: GenParams) -> None:
        path, body = self.body(prompt, params)
        try:
            async with self._sem:
                data = await self._post(path, body)
            self._done.put((rid, self._completion(data)))
        except BaseException as exc:  # handed to the caller's step(), never lost in the loop
            self._done.put((rid, exc))

    async def _post(self, path: str, body: dict) -> dict:
        import httpx

        last = ""
        for attempt in range(self.max_retries + 1):
            if attempt:
                self.stats["retries"] += 1
                await asyncio.sleep(self.backoff_s * 2 ** (attempt - 1))
            try:
                r = await self._client.post(path, json=body)
            except (httpx.TimeoutException, httpx.TransportError) as exc:
                last = f"{type(exc).__name__}: {exc}"
                continue
            if r.status_code in RETRY_STATUS:
                last = f"HTTP {r.status_code}: {r.text[:200]}"
                continue
            if r.status_code >= 400:
                raise EngineUnavailable(f"the server at {self.base_url} refused a request (HTTP {r.status_code}: "
                                        f"{r.text[:300]})")
            return r.json()
        raise EngineUnavailable(f"the server at {self.base_url} did not answer a request after {self.max_retries} "
                                f"retries ({last})")

    def _completion(self, data: dict) -> Completion:
        choices = sorted(data["choices"], key=lambda c: c.get("index", 0))
        texts = tuple((c["message"]["content"] or "") if "message" in c else c["text"] for c in choices)
        reasons = [c.get("finish_reason") or "unknown" for c in choices]
        usage = data.get("usage") or {}
        self.server_fingerprint = data.get("system_fingerprint") or self.server_fingerprint
        extra: dict[str, Any] = {"cached_tokens": int(((usage.get("prompt_tokens_details") or {})
                                                       .get("cached_tokens")) or 0)}
        if len(choices) > 1:
            extra["finish_reasons"] = reasons
        return Completion(texts=texts, finish_reason=reasons[0], prompt_tokens=int(usage.get("prompt_tokens") or 0),
                          output_tokens=int(usage.get("completion_tokens") or 0), extra=extra)

    # -- the step loop (StepEngine) --------------------------------------------------------------
    def submit(self, requests: Sequence[Request]) -> None:
        for r in requests:
            self._live[r.rid] = asyncio.run_coroutine_threadsafe(self._one(r.rid, r.prompt, r.params), self._loop)

    def step(self) -> list[tuple[str, Completion]]:
        """The requests that finished since the last step (waits for at least one while any is in flight).
        A request that failed for good raises EngineUnavailable — after the completions that came back with
        it have been returned (at the next call), so the completion cache keeps every answered request."""
        if self._error is not None:
            error = self._error
            self.cancel()
            raise error
        if not self._live:
            return []
        t0 = time.perf_counter()
        got = [self._done.get()]
        while True:
            try:
                got.append(self._done.get_nowait())
            except queue.Empty:
                break
        out = []
        for rid, value in got:
            self._live.pop(rid, None)
            if isinstance(value, BaseException):
                self._error = self._error or value
            else:
                out.append((rid, value))
        self._account([c for _, c in out], time.perf_counter() - t0)
        if not out and self._error is not None:
            return self.step()
        return out

    def pending(self) -> int:
        return len(self._live) + (self._error is not None)  # a failure still to be raised counts as pending

    def cancel(self) -> None:
        for fut in self._live.values():
            fut.cancel()
        self._live.clear()
        self._error = None
        while not self._done.empty():
            self._done.get_nowait()

    def generate(self, prompts: Sequence[str], params: Sequence[GenParams]) -> list[Completion]:
        if len(prompts) != len(params):
            raise ValueError(f"{len(prompts)} prompts but {len(params)} params")
        if self._live:
            raise RuntimeError("generate() while step-loop requests are in flight: use one way at a time")
        self.submit([Request(str(i), p, gp) for i, (p, gp) in enumerate(zip(prompts, params))])
        got: dict[str, Completion] = {}
        while self.pending():
            got.update(self.step())
        return [got[str(i)] for i in range(len(prompts))]

    def _account(self, completions: list[Completion], elapsed: float) -> None:
        prompt = sum(c.prompt_tokens for c in completions)
        output = sum(c.output_tokens for c in completions)
        self.stats["requests"] += len(completions)
        self.stats["prompt_tokens"] += prompt
        self.stats["output_tokens"] += output
        self.stats["seconds"] += elapsed
        if self.on_progress is not None:
            self.on_progress(len(completions), prompt + output)
        log_tokens(completions)  # the test suite's token budget (tests/conftest.py)

    # -- EngineInfo ---------------------------------------------------------------------------
    def count_tokens(self, prompt: str) -> int | None:
        """Tokens of `prompt` as the server will see it (template included), from vLLM's `POST /tokenize`
        (vllm/entrypoints/serve/tokenize/protocol.py); None where the server has no such endpoint. The
        scheduler asks only for prompts near `max_model_len` (batch/scheduler.py `fits`)."""
        import httpx

        body: dict[str, Any] = {"model": self.served}
        if self.endpoint == "chat":
            body |= {"messages": [{"role": "user", "content": prompt}], "add_generation_prompt": True}
        else:
            body["prompt"] = prompt
        try:
            r = httpx.post(self.base_url.removesuffix("/v1") + "/tokenize", json=body, headers=self._headers,
                           timeout=60)
            return int(r.json()["count"]) if r.status_code == 200 else None
        except (httpx.HTTPError, ValueError, KeyError, TypeError):
            return None

    def capacity(self) -> int:
        return self.max_concurrency

    def facts(self) -> dict:
        return {"model_id": self.model_id, "device": "server", "backend": "openai", "base_url": self.base_url,
                "served_model": self.served, "system_fingerprint": self.server_fingerprint,
                "endpoint": self.endpoint, "max_concurrency": self.max_concurrency}

    @property
    def engine_stats(self):
        return None

    def close(self) -> None:
        self.cancel()
        if self._client is not None:
            asyncio.run_coroutine_threadsafe(self._client.aclose(), self._loop).result(timeout=10)
        self._loop.call_soon_threadsafe(self._loop.stop)
