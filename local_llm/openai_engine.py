"""`OpenAIEngine`: a model that already runs as a server speaking the OpenAI-compatible API (`vllm serve`,
SGLang, TGI, llama.cpp's server), as a clarify engine (docs/engines.md#a-running-server-the-openai-backend).

Many requests are in flight at once — async HTTP on one background event loop, at most
`max_concurrency` — so the continuous scheduler keeps the server's batch full: `submit` starts requests,
`step` returns those that finished (the StepEngine contract, local_llm/engine.py). Each request carries
its own `seed`, stop strings, `max_tokens`, temperature and top_p; top_k, min_p and repetition_penalty are
sent as their neutral values, so a server's generation_config defaults never change the sampling.

Constraints: a request's `choices` or `grammar` (local_llm/engine.py GenParams) go in vLLM's dialect,
`structured_outputs` (vllm/entrypoints/openai/chat_completion/protocol.py), and only to a vLLM server: one
whose `GET /v1/models` lists the model as owned by "vllm" (`ServedModel`, local_llm/openai_http.py). Other OpenAI-compatible servers
read other fields or none, and may ignore an unknown one silently: a run whose settings ask for grammars is
refused at the start-up check, in one line, before any request (`check_constrainable`); the verification's
True/False choice is sent to them unconstrained (its reader takes the verdict from the text), said once.

Chat models get the prompt as one user message (`/v1/chat/completions`: the server applies the chat
template, as the in-process engine does); `endpoint = "completions"` sends the raw text (base models).

Time: each exchange has a TOTAL deadline (local_llm/openai_http.py). `step()` waits in slices of
`STEP_SLICE_S`, so a stop signal that arrives while requests are in flight ends the step within that slice
(stops.requested): the run then cancels them, writes its finished trees and commits the cache, as with the
in-process engine.

Failures: 429, 5xx, timeouts and connection errors are retried with exponential backoff (1, 2, 4 … s,
at most `max_retries` times); a request's completion is returned once, whatever the retries, so the
completion cache never records one twice. When a request exhausts its retries, is refused (another 4xx,
a redirect), or is answered with something that is not a completion (local_llm/openai_reply.py
`parse_reply`: cut-off or non-JSON bodies, missing or malformed choices, another model, an unknown finish
reason, a reply far larger than `max_tokens` allows, text that is not Unicode) the step raises
`EngineUnavailable` — one line naming the server, the request and what was wrong — after the completions
that came back with it were returned: the run stops with that line, keeps what finished, and the same
command resumes. Nothing that fails `parse_reply` reaches the completion cache.

Identity: the completion-cache key's model part is `openai:<model id as /v1/models reports
it>@<base url without credentials>`, so completions of two served models never mix, and never mix with
the in-process engine's. Credentials and their redaction: local_llm/openai_auth.py.
"""

from __future__ import annotations

import asyncio
import queue
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from clarify import console, stops
from clarify.errors import EngineUnavailable, InputError
from clarify.local_llm.engine import Completion, GenParams, Request, log_tokens
from clarify.local_llm.openai_auth import Server
from clarify.local_llm.openai_http import (
    SMALL_REPLY_BYTES,
    ClientOptions,
    Endpoint,
    exchange,
    redirect,
    resolve_served_model,
)
from clarify.local_llm.openai_reply import BadReply, count, json_body, parse_reply, reply_cap

RETRY_STATUS = {408, 409, 425, 429, 500, 502, 503, 504}
STEP_SLICE_S = 0.1  # step() waits in slices this long: a stop signal is seen within one (module docstring)


class OpenAIEngine:
    """Engine, EngineInfo and StepEngine over an OpenAI-compatible HTTP server (module docstring)."""

    def __init__(self, base_url: str, model: str = "", *, api_key_env: str = ClientOptions.api_key_env,
                 endpoint: str = ClientOptions.endpoint, max_concurrency: int = ClientOptions.max_concurrency,
                 request_timeout_s: float = ClientOptions.request_timeout_s,
                 max_retries: int = ClientOptions.max_retries, max_model_len: int | None = None,
                 backoff_s: float = 1.0, check_timeout_s: float = ClientOptions.check_timeout_s,
                 reply_bytes_per_token: int = ClientOptions.reply_bytes_per_token,
                 constrained: Sequence[str] = ()):
        """Every default is the option's declaration (ClientOptions)."""
        if endpoint not in tuple(Endpoint):
            raise InputError(f"unknown endpoint {endpoint!r}; choose {' or '.join(Endpoint)}", field="model.endpoint")
        self._server = Server(base_url, api_key_env)
        self.base_url = self._server.url  # never the credentials
        # `constrained`: the settings that will send grammars; refused here, before any request, by a
        # server that cannot read them (module docstring, "Constraints")
        listed = resolve_served_model(base_url, model, api_key_env, check_timeout_s, constrained)
        self.served, self.constrains = listed.id, listed.constrains
        self.model_id = f"openai:{self.served}@{self.base_url}"
        self.endpoint, self.max_retries, self.backoff_s = endpoint, max_retries, backoff_s
        self.max_concurrency, self.timeout_s, self.check_timeout_s = max_concurrency, request_timeout_s, check_timeout_s
        self.bytes_per_token = reply_bytes_per_token
        self.max_model_len = max_model_len  # the scheduler's context check; the server refuses longer ones too
        self.on_progress: Callable[[int, int], None] | None = None
        self._done: queue.Queue = queue.Queue()  # (rid, serial, Completion | EngineUnavailable)
        self._live: dict[str, tuple[int, Any]] = {}  # rid -> (serial, concurrent future)
        self._serial = 0  # a result is taken only from the request now live under its rid (not a cancelled one)
        self._error: EngineUnavailable | None = None  # a request that failed for good, raised at the next step
        self.stats = {"requests": 0, "retries": 0, "prompt_tokens": 0, "output_tokens": 0, "seconds": 0.0}
        self.server_fingerprint: str | None = None
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="openai-engine", daemon=True)
        self._thread.start()
        self._client = None
        self._sem = None
        asyncio.run_coroutine_threadsafe(self._open(), self._loop).result()

    async def _open(self) -> None:
        self._client = self._server.client(self.timeout_s, self.max_concurrency)
        self._sem = asyncio.Semaphore(self.max_concurrency)

    # -- one request ---------------------------------------------------------------------------
    def body(self, prompt: str, params: GenParams) -> tuple[str, dict]:
        """The endpoint and JSON body of one request (vLLM's OpenAI-compatible protocol)."""
        body: dict[str, Any] = {"model": self.served, "n": params.n, "temperature": params.temperature,
                                "top_p": params.top_p, "max_tokens": params.max_tokens, "seed": params.seed,
                                "stop": list(params.stop), "top_k": 0, "min_p": 0.0, "repetition_penalty": 1.0}
        if self.constrains and params.choices is not None:
            body["structured_outputs"] = {"choice": list(params.choices)}
        elif self.constrains and params.grammar is not None:  # EBNF, as vLLM's xgrammar backend reads it
            body["structured_outputs"] = {"grammar": params.grammar}
        if self.endpoint == Endpoint.CHAT:
            body["messages"] = [{"role": "user", "content": prompt}]
            return "/chat/completions", body
        body["prompt"] = prompt
        return "/completions", body

    def _about(self, error: EngineUnavailable, path: str, prompt: str) -> EngineUnavailable:
        """The one line for a request that failed for good: what was wrong (`error`), and which request,
        credentials redacted."""
        tail = prompt[-40:].strip()
        return EngineUnavailable(self._server.say(
            f"{error} (POST {path}, the prompt ending {tail!r}); nothing of it was cached"))

    async def _one(self, rid: str, serial: int, prompt: str, params: GenParams) -> None:
        path, body = self.body(prompt, params)
        try:
            async with self._sem:
                raw = await self._post(path, body, params)
            comp = parse_reply(raw, params, chat=self.endpoint == Endpoint.CHAT, served=self.served,
                               bytes_per_token=self.bytes_per_token)
            self._done.put((rid, serial, comp))
            return
        except asyncio.CancelledError:
            raise
        except BadReply as exc:
            error = EngineUnavailable(f"the server at {self.base_url} sent a reply that is not a completion: {exc}")
        except EngineUnavailable as exc:
            error = exc
        except Exception as exc:  # noqa: BLE001 - anything else is one line too, never lost in the loop
            error = EngineUnavailable(f"the server at {self.base_url} failed a request ({type(exc).__name__}: {exc})")
        self._done.put((rid, serial, self._about(error, path, prompt)))

    async def _post(self, path: str, body: dict, params: GenParams) -> bytes:
        import httpx

        last = ""
        cap = reply_cap(params, self.bytes_per_token)
        for attempt in range(self.max_retries + 1):
            if attempt:
                self.stats["retries"] += 1
                await asyncio.sleep(self.backoff_s * 2 ** (attempt - 1))
            try:
                status, headers, raw = await exchange(self._client, "POST", path, body=body,
                                                       deadline_s=self.timeout_s, max_bytes=cap)
            except TimeoutError:
                last = f"no whole reply within {self.timeout_s:g} s (model.request_timeout_s)"
                continue
            except httpx.TransportError as exc:  # connection refused, reset, closed mid-body
                last = f"{type(exc).__name__}: {exc}"
                continue
            if status in RETRY_STATUS:
                last = f"HTTP {status}: {raw[:200].decode('utf-8', 'replace')}"
                continue
            if 300 <= status < 400:
                raise EngineUnavailable(f"the server at {self.base_url} answered {redirect(status, headers)}")
            if status != 200:
                raise EngineUnavailable(f"the server at {self.base_url} refused a request (HTTP {status}: "
                                        f"{raw[:300].decode('utf-8', 'replace')})")
            return raw
        raise EngineUnavailable(f"the server at {self.base_url} did not answer a request after {self.max_retries} "
                                f"retries ({last})")

    # -- the step loop (StepEngine) --------------------------------------------------------------
    def submit(self, requests: Sequence[Request]) -> None:
        if not self.constrains:
            self._unconstrained(requests)
        for r in requests:
            self._serial += 1
            fut = asyncio.run_coroutine_threadsafe(self._one(r.rid, self._serial, r.prompt, r.params), self._loop)
            self._live[r.rid] = (self._serial, fut)

    def _unconstrained(self, requests: Sequence[Request]) -> None:
        """A server that cannot constrain (module docstring, "Constraints"): a grammar is refused before it is
        sent (the start-up check refuses a run that asks for one first); a choice is sent unconstrained."""
        if any(r.params.grammar is not None for r in requests):
            raise InputError(f"this server cannot constrain decoding (the server at {self.base_url} is not vLLM's) "
                             f"and a request asks for a grammar", field="model.base_url")
        if any(r.params.choices is not None for r in requests):
            console.note("openai-choices", f"the server at {self.base_url} cannot constrain decoding (not vLLM's): "
                                           f"choices such as the verification's True/False were decoded freely "
                                           f"and read from the text")

    def step(self) -> list[tuple[str, Completion]]:
        """The requests that finished since the last step (waits for at least one while any is in flight,
        in slices: a pending stop signal returns [] at once, and the caller's `stops.deferred()` block then
        raises it). A request that failed for good raises EngineUnavailable — after the completions that
        came back with it have been returned (at the next call), so the completion cache keeps every
        answered request."""
        if self._error is not None:
            error = self._error
            self.cancel()
            raise error
        if not self._live:
            return []
        t0 = time.perf_counter()
        out: list[tuple[str, Completion]] = []
        while self._live and not out and self._error is None:
            try:
                got = [self._done.get(timeout=STEP_SLICE_S)]
            except queue.Empty:
                if stops.requested():
                    return []
                continue
            while True:
                try:
                    got.append(self._done.get_nowait())
                except queue.Empty:
                    break
            for rid, serial, value in got:
                if self._live.get(rid, (None,))[0] != serial:
                    continue  # a request cancelled before it finished
                self._live.pop(rid)
                if isinstance(value, BaseException):
                    self._error = self._error or value
                else:
                    out.append((rid, value))
        if not out and self._error is not None:
            return self.step()
        self._account([c for _, c in out], time.perf_counter() - t0)
        return out

    def pending(self) -> int:
        return len(self._live) + (self._error is not None)  # a failure still to be raised counts as pending

    def cancel(self) -> None:
        for _, fut in self._live.values():
            fut.cancel()
        self._live.clear()
        self._error = None
        while not self._done.empty():
            self._done.get_nowait()

    def generate(self, prompts: Sequence[str], params: Sequence[GenParams]) -> list[Completion]:
        """All prompts' completions. A request that fails for good raises EngineUnavailable with
        `completed` set to the completions that came back (by position), so a cache keeps them."""
        if len(prompts) != len(params):
            raise ValueError(f"{len(prompts)} prompts but {len(params)} params")
        if self._live:
            raise RuntimeError("generate() while step-loop requests are in flight: use one way at a time")
        self.submit([Request(str(i), p, gp) for i, (p, gp) in enumerate(zip(prompts, params))])
        got: dict[str, Completion] = {}
        try:
            while self.pending():
                got.update(self.step())
        except EngineUnavailable as exc:
            exc.completed = {int(rid): c for rid, c in got.items()}
            raise
        except BaseException:  # a stop signal: nothing left running on the server's behalf
            self.cancel()
            raise
        return [got[str(i)] for i in range(len(prompts))]

    def _account(self, completions: list[Completion], elapsed: float) -> None:
        prompt = sum(c.prompt_tokens for c in completions)
        output = sum(c.output_tokens for c in completions)
        self.stats["requests"] += len(completions)
        self.stats["prompt_tokens"] += prompt
        self.stats["output_tokens"] += output
        self.stats["seconds"] += elapsed
        for c in completions:
            self.server_fingerprint = c.extra.get("system_fingerprint") or self.server_fingerprint
        if self.on_progress is not None:
            self.on_progress(len(completions), prompt + output)
        log_tokens(completions)  # the test suite's token budget (tests/conftest.py)

    # -- EngineInfo ---------------------------------------------------------------------------
    def count_tokens(self, prompt: str) -> int | None:
        """Tokens of `prompt` as the server will see it (template included), from vLLM's `POST /tokenize`
        (vllm/entrypoints/serve/tokenize/protocol.py), within `check_timeout_s`; None where the server has
        no such endpoint or does not answer in time. The scheduler asks only for prompts near
        `max_model_len` (batch/run/scheduler.py `fits`)."""
        body: dict[str, Any] = {"model": self.served}
        if self.endpoint == Endpoint.CHAT:
            body |= {"messages": [{"role": "user", "content": prompt}], "add_generation_prompt": True}
        else:
            body["prompt"] = prompt
        # vLLM serves /tokenize beside /v1, not under it
        url = self.base_url.removesuffix("/v1") + "/tokenize"
        request = exchange(self._client, "POST", url, body=body, deadline_s=self.check_timeout_s,
                             max_bytes=SMALL_REPLY_BYTES)
        try:
            status, _, raw = asyncio.run_coroutine_threadsafe(request, self._loop).result()
            tokens = json_body(raw).get("count") if status == 200 else None
            return count(tokens, "count") if tokens is not None else None
        except Exception:  # noqa: BLE001 - any failure: unknown, the server checks the context itself
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
