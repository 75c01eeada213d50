"""`OpenAIEngine`: a model that already runs as a server speaking the OpenAI-compatible API (`vllm serve`,
SGLang, TGI, llama.cpp's server), as a clarify engine (docs/engines.md#a-running-server-the-openai-backend).

Many requests are in flight at once — async HTTP on one background event loop, at most
`max_concurrency` — so the continuous scheduler keeps the server's batch full: `submit` starts requests,
`step` returns those that finished (the StepEngine contract, local_llm/engine.py). Each request carries
its own `seed`, stop strings, `max_tokens`, temperature and top_p; top_k, min_p and repetition_penalty are
sent as their neutral values, so a server's generation_config defaults never change the sampling.

Constraints: a request's `choices` or `grammar` (local_llm/engine.py GenParams) go in vLLM's dialect,
`structured_outputs` (vllm/entrypoints/openai/chat_completion/protocol.py), and only to a vLLM server: one
whose `GET /v1/models` lists the model as owned by "vllm" (`ServedModel`). Other OpenAI-compatible servers
read other fields or none, and may ignore an unknown one silently: a run whose settings ask for grammars is
refused at the start-up check, in one line, before any request (`check_constrainable`); the verification's
True/False choice is sent to them unconstrained (its reader takes the verdict from the text), said once.

Chat models get the prompt as one user message (`/v1/chat/completions`: the server applies the chat
template, as the in-process engine does); `endpoint = "completions"` sends the raw text (base models).

Time: every exchange has a TOTAL deadline — connecting, waiting and the whole reply — not httpx's
per-read timeout, under which a server that sends one byte every few seconds is never timed out:
`request_timeout_s` for a completion, `check_timeout_s` for the start-up `GET /v1/models` and a token
count (`ClientOptions`, a run's [model] table). `step()` waits in slices of `STEP_SLICE_S`, so a stop signal that
arrives while requests are in flight ends the step within that slice (stops.requested): the run then
cancels them, writes its finished trees and commits the cache, as with the in-process engine.

Failures: 429, 5xx, timeouts and connection errors are retried with exponential backoff (1, 2, 4 … s,
at most `max_retries` times); a request's completion is returned once, whatever the retries, so the
completion cache never records one twice. When a request exhausts its retries, is refused (another 4xx,
a redirect), or is answered with something that is not a completion (`parse_reply`: cut-off or non-JSON
bodies, missing or malformed choices, another model, an unknown finish reason, a reply far larger than
`max_tokens` allows, text that is not Unicode) the step raises `EngineUnavailable` — one line naming the
server, the request and what was wrong — after the completions that came back with it were returned:
the run stops with that line, keeps what finished, and the same command resumes. Nothing that fails
`parse_reply` reaches the completion cache.

Text: a reply's text must be valid Unicode without NUL (a lone surrogate such as `\\ud800`, invalid UTF-8
or a NUL refuses the whole reply: no working detokenizer produces them, so they mean a broken server).
The other control characters (C0 but tab, newline and carriage return; DEL; C1) are replaced by U+FFFD,
as vLLM's detokenizer writes a byte it cannot decode: a model may emit them as byte tokens, and they
must not reach a terminal or a later prompt as escape sequences.

Identity and secrets: the completion-cache key's model part is `openai:<model id as /v1/models reports
it>@<base url without credentials>`, so completions of two served models never mix, and never mix with
the in-process engine's. The API key is read from the environment variable the config names; user
and password in the URL (`http://user:pass@host/v1`) are sent as HTTP basic auth. Neither is written
anywhere: every message this module makes passes through `errors.redacted`.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import os
import queue
import re
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any
from urllib.parse import unquote, urlsplit, urlunsplit

from clarify import console, stops
from clarify.errors import EngineUnavailable, InputError, printable, redacted
from clarify.local_llm.engine import Completion, GenParams, Request, log_tokens
from clarify.options import setting

log = logging.getLogger(__name__)
RETRY_STATUS = {408, 409, 425, 429, 500, 502, 503, 504}
# What a completion may finish with: the OpenAI API's and vLLM's reasons for a text that ended on a stop
# (string, token or the end of a choice) or on max_tokens (vllm/entrypoints/openai/protocol.py). Any
# other ("abort", "content_filter", "tool_calls", null) is not a plain completion and is refused.
FINISH_REASONS = ("stop", "length")
STEP_SLICE_S = 0.1  # step() waits in slices this long: a stop signal is seen within one (module docstring)
ENVELOPE_BYTES = 64 << 10  # a reply's JSON around its texts (ids, usage, logprob-free choices): generous
SMALL_REPLY_BYTES = 4 << 20  # a model list or a token count (vLLM's /tokenize lists the token ids)
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
# C0 controls but tab, newline and carriage return; DEL; C1 (module docstring, "Text")
_CONTROL = re.compile("[\x01-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]")


class Endpoint(StrEnum):
    """Where a prompt goes: "chat" sends it as one user message (/v1/chat/completions: the server applies the
    chat template), "completions" as raw text (/v1/completions: base models)."""

    CHAT = "chat"
    COMPLETIONS = "completions"


@dataclass(frozen=True)
class ClientOptions:
    """How the openai backend talks to its server, each option declared here once with its default (a run's
    `[model]` table, batch/config.py ModelConfig, is made of these and local_llm/settings.py EngineOptions).
    None of them changes a completion the client accepts (batch/config.py RESULT_FREE), but the address."""

    base_url: str = setting("", help="openai: the server's address, e.g. http://127.0.0.1:8000/v1")
    api_key_env: str = setting("", help="openai: the NAME of an environment variable holding the server's API "
                                        "key (never the key)")
    endpoint: Endpoint = setting(Endpoint.CHAT, help="openai: \"chat\" (the server applies the chat template) or "
                                                     "\"completions\" (raw text)")
    max_concurrency: int = setting(64, help="openai: requests in flight at once")
    request_timeout_s: float = setting(600.0, help="openai: one request's TOTAL time limit in seconds: "
                                                   "connecting, waiting and the whole reply (a server that trickles "
                                                   "its reply a byte at a time is cut off); then it is retried "
                                                   "like a 5xx")
    max_retries: int = setting(6, help="openai: retries of a request on 429/5xx/timeouts (backoff 1, 2, 4 ... s)")
    check_timeout_s: float = setting(10.0, help="openai: the total time limit in seconds of the start-up check "
                                                "(GET /v1/models) and of a token count (POST /tokenize)")
    # Generous: the longest tokens of common vocabularies (runs of spaces or dashes) are far shorter than 128 bytes.
    reply_bytes_per_token: int = setting(128, help="openai: the longest reply accepted, in UTF-8 bytes of text per "
                                                   "requested token (max_tokens); a longer one is refused before "
                                                   "it is read to the end, and never cached")


class BadReply(Exception):
    """A reply that is not what was asked for; the message says what is wrong, in words."""


# -- credentials ------------------------------------------------------------------------------------
def split_credentials(url: str) -> tuple[str, tuple[str, str] | None]:
    """`url` without its userinfo, and the (user, password) it held (percent-decoded), or None."""
    parts = urlsplit(url)
    if "@" not in parts.netloc:
        return url, None
    userinfo, _, host = parts.netloc.rpartition("@")
    user, _, password = userinfo.partition(":")
    return urlunsplit(parts._replace(netloc=host)), (unquote(user), unquote(password))


def _api_key(api_key_env: str) -> str | None:
    if not api_key_env:
        return None
    if not _ENV_NAME.match(api_key_env):  # the key itself given by mistake: never echo it
        raise InputError("takes the NAME of an environment variable (letters, digits, _) that holds the key, "
                         "never the key itself", field="model.api_key_env")
    key = os.environ.get(api_key_env)
    if not key:
        raise InputError(f"the environment variable {api_key_env} (the server's API key) is not set",
                         field="model.api_key_env")
    return key


class _Server:
    """Where to talk to and how to authenticate: the base URL without credentials, the httpx client
    options that carry them, and the strings no message may show (the key, the password, and the
    basic-auth and bearer forms a server may echo)."""

    def __init__(self, base_url: str, api_key_env: str = ""):
        clean, userinfo = split_credentials(base_url.rstrip("/"))
        self.url = clean.rstrip("/")
        key = _api_key(api_key_env)
        self.headers = {"Authorization": f"Bearer {key}"} if key else {}
        self.auth = None if key else userinfo  # one Authorization header: the key wins over URL credentials
        self.secrets: list[str] = []
        if key:
            self.secrets.append(key)
        if userinfo:
            user, password = userinfo
            self.secrets += [password, base64.b64encode(f"{user}:{password}".encode()).decode()]

    def say(self, text: object) -> str:
        """`text` safe to print or write: credentials redacted, control characters escaped."""
        return printable(redacted(text, self.secrets))

    def client(self, timeout_s: float, connections: int = 1):
        import httpx

        # the per-phase timeouts are a backstop; the deadline that counts is the total one (`_exchange`)
        return httpx.AsyncClient(base_url=self.url, headers=self.headers, auth=self.auth, timeout=timeout_s,
                                 limits=httpx.Limits(max_connections=connections), follow_redirects=False)


async def _exchange(client, method: str, path: str, *, deadline_s: float, max_bytes: int,
                    body: dict | None = None) -> tuple[int, Any, bytes]:
    """(status, headers, body bytes) of one exchange, all of it within `deadline_s` seconds
    (TimeoutError otherwise); a body over `max_bytes` is refused (BadReply) as soon as it is seen to be,
    so a huge reply costs neither the time to read it nor the memory to hold it."""
    async with asyncio.timeout(deadline_s):
        async with client.stream(method, path, json=body) as r:
            declared = r.headers.get("content-length", "")
            if declared.isdigit() and int(declared) > max_bytes:
                raise BadReply(f"a reply of {int(declared):,} bytes, over the {max_bytes:,} this request allows")
            chunks, size = [], 0
            async for chunk in r.aiter_bytes():  # decoded: a compressed bomb is capped as it inflates
                size += len(chunk)
                if size > max_bytes:
                    raise BadReply(f"a reply over the {max_bytes:,} bytes this request allows (cut off there)")
                chunks.append(chunk)
            return r.status_code, r.headers, b"".join(chunks)


def _redirect(status: int, headers) -> str:
    return (f"HTTP {status}, a redirect to {headers.get('location', '(no location)')}: clarify does not follow "
            f"redirects; set [model] base_url to the address that answers")


def _json(raw: bytes) -> Any:
    """The JSON of a body; BadReply saying what it is instead (empty, not UTF-8, an HTML page, cut off)."""
    if not raw.strip():
        raise BadReply("an empty body")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BadReply(f"a body that is not valid UTF-8 (byte {exc.start})") from None
    try:
        return json.loads(text)
    except ValueError as exc:  # JSONDecodeError
        what = "an HTML page" if text.lstrip()[:1] == "<" else "not JSON (cut off, or not an API reply)"
        pos = getattr(exc, "pos", None)
        raise BadReply(f"{what} ({getattr(exc, 'msg', exc)}, character {pos}), beginning {text[:60]!r}") from None


# vLLM's server lists each model with owned_by "vllm" (vllm/entrypoints/serve/engine/protocol.py:109 ModelCard,
# vLLM 0.32; SGLang, TGI and llama.cpp's server write their own names there).
VLLM_OWNER = "vllm"


@dataclass(frozen=True)
class ServedModel:
    """A model as `GET /v1/models` lists it: its id, and who the server says owns it."""

    id: str
    owned_by: str | None = None

    @property
    def constrains(self) -> bool:
        """Whether clarify can send this server constraints: vLLM's server, which reads `structured_outputs`."""
        return self.owned_by == VLLM_OWNER


def check_constrainable(served: ServedModel, where: str, constrained: Sequence[str]) -> None:
    """The start-up check of constraints: InputError, in one line, when `constrained` (the settings that ask
    for grammars, e.g. "toc.constrain_format") is not empty and the server is not one that reads them."""
    if constrained and not served.constrains:
        owner = f"owned_by {printable(repr(served.owned_by))}" if served.owned_by is not None else "no owned_by"
        raise InputError(f"this server cannot constrain decoding ({where} lists {printable(repr(served.id))} with "
                         f"{owner}, not {VLLM_OWNER!r}: clarify sends grammars only in vLLM's structured_outputs); "
                         "set " + " and ".join(f"{name} = false" for name in constrained), field="model.base_url")


def served_models(base_url: str, api_key_env: str = ClientOptions.api_key_env,
                  timeout_s: float = ClientOptions.check_timeout_s) -> list[str]:
    """The model ids the server at `base_url` serves."""
    return [m.id for m in _model_list(base_url, api_key_env, timeout_s)]


def _model_list(base_url: str, api_key_env: str, timeout_s: float) -> list[ServedModel]:
    """The models the server at `base_url` serves (`GET /v1/models`, all of it within `timeout_s`);
    InputError, in one line, when it does not answer or is not an OpenAI-compatible server."""
    import httpx

    server = _Server(base_url, api_key_env)
    url = server.url + "/models"

    async def get() -> tuple[int, Any, bytes]:
        async with server.client(timeout_s) as client:
            return await _exchange(client, "GET", "/models", deadline_s=timeout_s, max_bytes=SMALL_REPLY_BYTES)

    fix = "start it (vllm serve MODEL --port ...) or fix [model] base_url"
    try:
        status, headers, raw = asyncio.run(get())
    except TimeoutError:
        raise InputError(f"the server at {server.url} did not answer GET {url} within {timeout_s:g} s "
                         f"(model.check_timeout_s); {fix}", field="model.base_url") from None
    except (httpx.HTTPError, BadReply, OSError) as exc:
        raise InputError(f"no OpenAI-compatible server answers at {server.url} "
                         f"({server.say(f'{type(exc).__name__}: {exc}')}); {fix}", field="model.base_url") from None
    if 300 <= status < 400:
        raise InputError(f"GET {url}: {server.say(_redirect(status, headers))}", field="model.base_url")
    if status != 200:
        raise InputError(f"the server answered {status} to GET {url}"
                         + (" (check [model] api_key_env, or the credentials in base_url)" if status in (401, 403)
                            else ""), field="model.base_url")
    try:
        data = _json(raw)
        ids = data["data"] if isinstance(data, dict) else None
        if not isinstance(ids, list) or not all(isinstance(m, dict) and isinstance(m.get("id"), str) for m in ids):
            raise BadReply("no list of models with ids in its 'data'")
        return [ServedModel(m["id"], m["owned_by"] if isinstance(m.get("owned_by"), str) else None) for m in ids]
    except BadReply as exc:
        raise InputError(f"the server at {server.url} is not OpenAI-compatible: GET {url} gave {server.say(exc)}; "
                         f"{fix}", field="model.base_url") from None


def resolve_served_model(base_url: str, model: str, api_key_env: str = ClientOptions.api_key_env,
                         timeout_s: float = ClientOptions.check_timeout_s,
                         constrained: Sequence[str] = ()) -> ServedModel:
    """The server's listing of `model` (of the one it serves when `model` is empty); InputError when it
    serves another, or cannot constrain decoding and `constrained` settings ask for it (`check_constrainable`)."""
    models = _model_list(base_url, api_key_env, timeout_s)
    ids = [m.id for m in models]
    where = split_credentials(base_url)[0]
    if not model:
        if len(ids) != 1:
            raise InputError(f"the server at {where} serves {printable(ids)}: name one in [model] model",
                             field="model.model")
        model = ids[0]
    if model not in ids:
        raise InputError(f"the server at {where} serves {printable(ids)}, not {printable(repr(model))}",
                         field="model.model")
    served = models[ids.index(model)]
    check_constrainable(served, f"the server at {where}", constrained)
    return served


# -- a reply, checked ----------------------------------------------------------------------------------
def reply_cap(params: GenParams, bytes_per_token: int) -> int:
    """The largest reply body accepted for `params`: each of its `n` texts at `bytes_per_token` bytes per
    requested token, JSON-escaped at worst (6 bytes for one: `\\u001b`), plus the envelope."""
    return ENVELOPE_BYTES + 6 * params.n * params.max_tokens * bytes_per_token


def _count(value: Any, name: str) -> int:
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise BadReply(f"{name} is {value!r}, not a count of tokens")
    return value


def _text(value: Any, where: str, cap: int) -> str:
    """A choice's text, checked and cleaned (module docstring, "Text")."""
    if not isinstance(value, str):
        raise BadReply(f"{where} is {'missing' if value is _MISSING else repr(value)[:40]}, not a string")
    try:
        size = len(value.encode("utf-8"))
    except UnicodeEncodeError as exc:
        raise BadReply(f"{where} holds a lone surrogate ({value[exc.start]!r}) at character {exc.start}: "
                       f"not Unicode") from None
    if "\x00" in value:
        raise BadReply(f"{where} holds a NUL character at character {value.index(chr(0))}")
    if size > cap:
        raise BadReply(f"{where} is {size:,} bytes, over the {cap:,} its max_tokens allows")
    return _CONTROL.sub("\ufffd", value)


_MISSING = object()


def parse_reply(raw: bytes, params: GenParams, *, chat: bool, served: str, bytes_per_token: int) -> Completion:
    """The Completion in a 200 reply's body, or BadReply saying what is wrong with it: every check that
    keeps a reply that is not a completion of this request out of the cache (module docstring)."""
    data = _json(raw)
    if not isinstance(data, dict):
        raise BadReply(f"a JSON {type(data).__name__}, not an object")
    if data.get("model") != served:
        raise BadReply(f"it names the model {data.get('model')!r:.80}, not {served!r} (the one /v1/models served)")
    choices = data.get("choices", _MISSING)
    if choices is _MISSING:
        raise BadReply("no 'choices'")
    if not isinstance(choices, list) or not choices:
        raise BadReply(f"'choices' is {choices!r:.40}, not a list of choices")
    if len(choices) != params.n:
        raise BadReply(f"{len(choices)} choices for n = {params.n}")
    by_index: dict[int, dict] = {}
    for pos, c in enumerate(choices):
        if not isinstance(c, dict):
            raise BadReply(f"choice {pos} is {c!r:.40}, not an object")
        i = c.get("index", pos)
        if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < params.n or i in by_index:
            raise BadReply(f"choice {pos} has index {i!r:.20}; want each of 0..{params.n - 1} once")
        by_index[i] = c
    cap = params.max_tokens * bytes_per_token
    texts, reasons = [], []
    for i in range(params.n):
        c = by_index[i]
        if chat:
            message = c.get("message")
            if not isinstance(message, dict):
                raise BadReply(f"choice {i} has no message")
            texts.append(_text(message.get("content", _MISSING), f"choice {i}'s message.content", cap))
        else:
            texts.append(_text(c.get("text", _MISSING), f"choice {i}'s text", cap))
        reason = c.get("finish_reason")
        if reason not in FINISH_REASONS:
            raise BadReply(f"choice {i} finished with {reason!r:.40}, not one of {FINISH_REASONS}")
        reasons.append(reason)
    usage = data.get("usage") or {}
    details = usage.get("prompt_tokens_details") if isinstance(usage, dict) else None
    if not isinstance(usage, dict) or not isinstance(details or {}, dict):
        raise BadReply(f"'usage' is {usage!r:.60}, not an object of counts")
    extra: dict[str, Any] = {"cached_tokens": _count((details or {}).get("cached_tokens"),
                                                     "usage.prompt_tokens_details.cached_tokens")}
    if params.n > 1:
        extra["finish_reasons"] = reasons
    fingerprint = data.get("system_fingerprint")
    if isinstance(fingerprint, str):
        extra["system_fingerprint"] = fingerprint[:200]
    return Completion(texts=tuple(texts), finish_reason=reasons[0],
                      prompt_tokens=_count(usage.get("prompt_tokens"), "usage.prompt_tokens"),
                      output_tokens=_count(usage.get("completion_tokens"), "usage.completion_tokens"), extra=extra)


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
        self._server = _Server(base_url, api_key_env)
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
                status, headers, raw = await _exchange(self._client, "POST", path, body=body,
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
                raise EngineUnavailable(f"the server at {self.base_url} answered {_redirect(status, headers)}")
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
        `max_model_len` (batch/scheduler.py `fits`)."""
        body: dict[str, Any] = {"model": self.served}
        if self.endpoint == Endpoint.CHAT:
            body |= {"messages": [{"role": "user", "content": prompt}], "add_generation_prompt": True}
        else:
            body["prompt"] = prompt
        # vLLM serves /tokenize beside /v1, not under it
        url = self.base_url.removesuffix("/v1") + "/tokenize"
        exchange = _exchange(self._client, "POST", url, body=body, deadline_s=self.check_timeout_s,
                             max_bytes=SMALL_REPLY_BYTES)
        try:
            status, _, raw = asyncio.run_coroutine_threadsafe(exchange, self._loop).result()
            count = _json(raw).get("count") if status == 200 else None
            return _count(count, "count") if count is not None else None
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
